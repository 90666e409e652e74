"""True plans (bf16-true): exactly half the bytes, the user's model after a fit, nothing
half-cast, the update probe against a hand count, checkpoints that keep dtypes and state."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import quiet
from torch import nn

import precision_nb as pnb
from precision_nb.core import remedies
from precision_nb.core.optim import OptimizerConfig
from precision_nb.engine import trainer as trainer_module
from precision_nb.engine.compare import compare
from precision_nb.engine.inspect import memory as mem
from precision_nb.engine.inspect.step import run_inspection
from precision_nb.engine.trainer import Trainer
from precision_nb.engine.workloads import get_workload


def _bytes(tensors) -> int:
    return sum(t.nbytes for t in tensors)


def _trained(precision: str, steps: int = 1) -> tuple[Trainer, tuple]:
    """mlp/small after ``steps`` steps, and a first batch for a backward by hand."""
    work = get_workload("mlp", "small")
    torch.manual_seed(0)
    batches = work.make_batches(torch.device("cpu"))
    t = Trainer(work.make_model(), batches, device="cpu", precision=precision, train=quiet())
    t.fit(steps)
    return t, batches(0)


def test_true_plan_halves_parameters_gradients_and_adamw_moments_exactly():
    sizes = {}
    for precision in ("bf16", "bf16-true"):
        t, (x, y) = _trained(precision)
        params = list(t.model.parameters())
        dtype = params[0].dtype
        loss = nn.functional.cross_entropy(t.model(x.to(dtype)), y)
        loss.backward()
        states = list(t.optimizer.state.values())
        sizes[precision] = {
            "params": _bytes(params),
            "grads": _bytes(p.grad for p in params),
            "moments": _bytes(s[k] for s in states for k in ("exp_avg", "exp_avg_sq")),
            "steps": _bytes(s["step"] for s in states),
            "dtypes": {p.dtype for p in params} | {s["exp_avg"].dtype for s in states},
        }
    mixed, true = sizes["bf16"], sizes["bf16-true"]
    assert mixed["dtypes"] == {torch.float32} and true["dtypes"] == {torch.bfloat16}
    for kind in ("params", "grads", "moments"):
        assert mixed[kind] == 2 * true[kind], kind
    assert mixed["steps"] == true["steps"]  # AdamW's step counters are fp32 scalars in both


def test_inspection_shows_the_halving_and_the_kahan_buffers_by_kind():
    def by_kind(precision):
        data = run_inspection("mlp", preset="small", precision=precision, device="cpu")
        out: dict = {}
        for r in data.memory:
            out.setdefault(r["kind"], {})[r["dtype"]] = r["bytes"]
        return out

    mixed, kahan = by_kind("bf16"), by_kind("bf16-true+kahan")
    assert kahan[mem.PARAMS] == {"bf16": mixed[mem.PARAMS]["fp32"] // 2}
    assert kahan[mem.GRADS] == {"bf16": mixed[mem.GRADS]["fp32"] // 2}
    assert kahan[mem.KAHAN] == {"bf16": kahan[mem.PARAMS]["bf16"]}  # one buffer per weight
    assert mem.KAHAN not in mixed


def test_fit_leaves_the_user_model_in_bf16_and_integer_buffers_as_they_were(batches):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    result = pnb.fit(model, batches, device="cpu", precision="bf16-true", steps=2, progress=False)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model[1].running_mean.dtype == torch.bfloat16
    assert model[1].num_batches_tracked.dtype == torch.int64
    assert int(model[1].num_batches_tracked) == 2
    said = " ".join(e.message for e in result.events if e.kind == "precision")
    assert "now bfloat16" in said and "1.num_batches_tracked (int64)" in said
    assert result.label == "bf16-true" and result.records[-1]["weights"] == "true"


def test_compare_leaves_the_user_model_untouched(make_model, batches):
    model = make_model()
    before = [p.detach().clone() for p in model.parameters()]
    out = compare(["fp32", "bf16-true"], model=model, batches=batches, device="cpu", steps=2,
                  progress=False, measure_peak=False)  # fmt: skip
    assert set(out.results) == {"fp32", "bf16-true"}
    assert out.results["bf16-true"].plan.true_weights
    for p, b in zip(model.parameters(), before, strict=True):
        assert p.dtype == torch.float32 and torch.equal(p, b)


def test_a_missing_remedy_library_is_named_before_the_model_is_touched(
    monkeypatch, make_model, batches
):
    monkeypatch.setattr(remedies, "installed", lambda name: False)
    model = make_model()
    with pytest.raises(ImportError, match=r"precision-nb\[remedies\]") as err:
        Trainer(model, batches, device="cpu", precision="bf16-true+kahan")
    assert "torch-optimi" in str(err.value)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    text = str(pnb.plan("bf16-true+stochastic", "cpu"))
    assert "torchao is NOT installed: pip install 'precision-nb[remedies]'" in text


def test_an_optimizer_that_cannot_be_built_leaves_nothing_cast(monkeypatch, batches):
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))

    def fail(*args, **kwargs):
        raise RuntimeError("no optimizer today")

    monkeypatch.setattr(trainer_module, "build_plan_optimizer", fail)
    with pytest.raises(RuntimeError, match="no optimizer today"):
        Trainer(model, batches, device="cpu", precision="bf16-true")
    assert {t.dtype for t in model.state_dict().values()} == {torch.float32, torch.int64}


def test_complex_parameters_are_refused_before_anything_is_cast(batches):
    model = nn.Linear(8, 2)
    model.phase = nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"cannot cast complex tensors \(phase\)"):
        Trainer(model, batches, device="cpu", precision="bf16-true")
    assert model.weight.dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(precision="fp32-true"), ["fp32-true", "no true variant"]),
        (dict(precision="auto-true"), ["auto-true", "needs its dtype named"]),
        (dict(precision="bf16-true+magic"), ["unknown remedy 'magic'", "+kahan"]),
        (dict(precision="bf16+kahan"), ["applies to a true plan only"]),
        (dict(precision="fp16-true+stochastic"), ["bf16 weights only"]),
        (dict(precision="bf16-true+kahan", fused=True), ["optimizer.fused", "remedy 'kahan'"]),
        (
            dict(precision="fp16-true", fused=False, simulate="cuda-bf16"),
            ["optimizer.fused", "NaN or inf"],
        ),
        (
            dict(precision="fp16-true+kahan", simulate="cuda-bf16"),
            ["optimizer.eps: invalid value 1e-08", "2**-24"],
        ),
    ],
)
def test_bad_true_requests_name_the_field_the_value_and_what_is_allowed(kwargs, words):
    with pytest.raises(ValueError) as err:
        pnb.plan(**kwargs)
    for word in words:
        assert word in str(err.value)


def test_torch_facts_behind_the_fp16_true_rule():
    """GradScaler refuses fp16 gradients; plain AdamW on fp16 state writes NaN/inf where the
    fused kernel does not (the cuda-fp16-true rule's reason, pinned on the installed torch)."""
    x = nn.Parameter(torch.ones(2, dtype=torch.float16))
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.AdamW([x])
    scaler.scale((x * x).sum()).backward()
    with pytest.raises(ValueError, match="unscale FP16 gradients"):
        scaler.unscale_(opt)
    grads = torch.tensor([0.0, 1e-3, 0.0, 1.0], dtype=torch.float16)
    for fused, finite in ((False, False), (True, True)):
        p = nn.Parameter(torch.ones(4, dtype=torch.float16))
        p.grad = grads.clone()
        torch.optim.AdamW([p], lr=1e-3, fused=fused).step()
        assert bool(torch.isfinite(p).all()) is finite
    # fp16-true+kahan: torch-optimi adds eps to fp16 state (NaN at eps 1e-8, not at 2**-24)
    from precision_nb.engine.remedies import remedy_optimizer

    for eps, finite in ((1e-8, False), (2.0**-24, True)):
        p = nn.Parameter(torch.ones(4, dtype=torch.float16))
        p.grad = grads.clone()
        remedy_optimizer([p], OptimizerConfig(eps=eps), "kahan").step()
        assert bool(torch.isfinite(p).all()) is finite


def test_the_update_probe_agrees_with_a_count_by_hand(batches, make_model):
    model = make_model()
    start = None

    def keep_start(result):
        nonlocal start
        start = [p.detach().clone() for p in model.parameters()]

    class Start:
        on_fit_start = staticmethod(keep_start)

    t = Trainer(model, batches, device="cpu", precision="bf16-true",
                optimizer=OptimizerConfig(lr=3e-4), train=quiet(steps=12, log_every=6))  # fmt: skip
    result = t.fit(callbacks=[Start()])
    total = sum(p.numel() for p in model.parameters())
    bits = torch.int16  # bf16 weights, compared bit for bit
    still = sum(
        int((p.view(bits) == s.view(bits)).sum())
        for p, s in zip(model.parameters(), start, strict=True)
    )
    last = result.records[-1]
    assert last["weights_never_moved"] == still / total
    assert 0 < last["weights_never_moved"] < 1
    assert [u["step"] for u in result.update_stats] == [6, 12]
    layers = result.update_stats[-1]["layers"]
    assert set(layers) == {n for n, _ in model.named_parameters()}


def test_tiny_updates_are_all_rounded_away_in_bf16_and_none_in_fp32(make_model, batches):
    lr = OptimizerConfig(lr=1e-7, weight_decay=0.0)

    def linear(seed=0):  # no ReLU: every element gets a non-zero gradient, so a non-zero update
        torch.manual_seed(seed)
        return nn.Linear(8, 2)

    true = Trainer(linear(), batches, device="cpu", precision="bf16-true", optimizer=lr,
                   train=quiet(steps=4, log_every=2))  # fmt: skip
    fp32 = Trainer(linear(), batches, device="cpu", precision="fp32", optimizer=lr,
                   train=quiet(steps=4, log_every=2, update_stats=True))  # fmt: skip
    lost, kept = true.fit().records[-1], fp32.fit().records[-1]
    assert lost["updates_rounded_away"] == 1.0 and lost["weights_never_moved"] == 1.0
    assert kept["updates_rounded_away"] == 0.0 and kept["weights_never_moved"] == 0.0
    mixed = Trainer(make_model(), batches, device="cpu", precision="bf16", train=quiet(steps=2))
    assert mixed.fit().records[-1]["updates_rounded_away"] is None  # off by default when mixed


def test_fit_probes_a_true_plan_only_when_asked_and_a_trainer_by_default():
    """fit() leaves the probe's cost out of a plain run (None reads as off there, as inspect);
    asked for, it measures; a Trainer, as the comparisons build it, measures a true plan."""
    kw = dict(preset="tiny", device="cpu", precision="bf16-true", steps=4, log_every=2,
              progress=False, measure_peak=False)  # fmt: skip
    plain, asked = pnb.fit("mlp", **kw), pnb.fit("mlp", update_stats=True, **kw)
    assert plain.records[-1]["updates_rounded_away"] is None and plain.update_stats == []
    assert [u["step"] for u in asked.update_stats] == [2, 4]
    assert 0 <= asked.records[-1]["updates_rounded_away"] <= 1
    work = get_workload("mlp", "tiny")
    torch.manual_seed(0)
    t = Trainer(work.make_model(), work.make_batches(torch.device("cpu")), device="cpu",
                precision="bf16-true", train=quiet(steps=4, log_every=2))  # fmt: skip
    assert [u["step"] for u in t.fit().update_stats] == [2, 4]


@pytest.mark.parametrize("precision", ["bf16-true", "bf16-true+kahan", "bf16-true+stochastic"])
def test_checkpoints_keep_dtypes_and_the_remedy_state(tmp_path, make_model, batches, precision):
    def trainer(seed=0):
        return Trainer(make_model(seed), batches, device="cpu", precision=precision,
                       train=quiet(steps=3, log_every=3))  # fmt: skip

    full = trainer()
    full.fit(6)
    part = trainer()
    part.fit(3)
    part.save_checkpoint(tmp_path / "c.pt")
    resumed = trainer(seed=5)
    resumed.load_checkpoint(tmp_path / "c.pt")
    assert {p.dtype for p in resumed.model.parameters()} == {torch.bfloat16}
    state = next(iter(resumed.optimizer.state.values()))
    saved = next(iter(part.optimizer.state.values()))
    assert set(state) == set(saved)
    assert ("kahan_comp" in state) == precision.endswith("kahan")
    for key, value in saved.items():
        assert state[key].dtype == value.dtype and torch.equal(state[key], value)
    resumed.fit(3)
    for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_distributed_true_run_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="true plans train on one process"):
        pnb.fit("mlp", precision="bf16-true", distributed=pnb.Distributed("ddp", 2),
                progress=False)  # fmt: skip


def test_a_missing_remedy_library_stops_a_comparison_and_the_cli_before_anything_runs(
    monkeypatch, capsys, tmp_path
):
    from precision_nb.cli.main import main

    monkeypatch.setattr(remedies, "installed", lambda name: False)
    with pytest.raises(ImportError, match=r"torchao.*precision-nb\[remedies\]"):
        compare(["fp32", "bf16-true+stochastic"], "mlp", "tiny", steps=1, progress=False)
    code = main(["profile", "--compare", "fp32,bf16-true+kahan", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "--compare: invalid value 'bf16-true+kahan'" in err
    assert "pip install 'precision-nb[remedies]'" in err and not (tmp_path / "o").exists()


def test_profile_and_the_cli_take_true_plans_in_one_spelling():
    from precision_nb.core.names import precision_list
    from precision_nb.engine.planning import plan_runs
    from precision_nb.views.report.profile import profile_request

    request = profile_request(compare="fp32, BF16-true+Kahan,bf16-mixed,bf16", device="cpu")
    assert [p.label for p in request.precisions] == ["fp32", "bf16-true+kahan", "bf16", "bf16"]
    # the same request twice is planned once
    assert list(plan_runs(request).labels) == ["fp32", "bf16-true+kahan", "bf16"]
    assert precision_list("bf16-true,fp16-true+kahan", "--compare") == [
        "bf16-true", "fp16-true+kahan",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="invalid value 'fp32-true'"):
        profile_request(compare="fp32-true")


def test_a_true_plans_outcome_carries_its_saving_and_lost_updates_and_the_views_show_them():
    from precision_nb.views.report import tables as col
    from precision_nb.views.report.answer import answers

    out = compare(["bf16", "bf16-true"], "mlp", "small", device="cpu", steps=2, progress=False,
                  measure_peak=False)  # fmt: skip
    inspections = {
        label: run_inspection("mlp", preset="small", precision=label, device="cpu")
        for label in out.results
    }
    assert out.outcome("bf16-true").saving is None  # not before both plans are inspected
    out.attach_inspections(inspections)
    saving = out.outcome("bf16-true").saving
    assert saving.mixed == "bf16" and out.outcome("bf16").saving is None
    kinds = {kind: (before, after) for kind, before, after in saving.by_kind}
    for kind in (mem.PARAMS, mem.GRADS):
        assert kinds[kind][0] == 2 * kinds[kind][1], kind
    # parameters + gradients + AdamW moments: exactly half; AdamW's fp32 step counters kept
    t, _ = _trained("bf16-true")
    counters = _bytes(s["step"] for s in t.optimizer.state.values())
    assert saving.kept == counters and saving.cast_ratio == 0.5
    assert saving.ratio == (saving.before / 2 + counters / 2) / saving.before
    lost = out.outcome("bf16-true").lost_updates
    stats = out.results["bf16-true"].update_stats[-1]
    assert (lost.step, lost.updates_rounded_away, lost.weights_never_moved) == (
        stats["step"], stats["updates_rounded_away"], stats["weights_never_moved"],
    )  # fmt: skip
    assert out.outcome("bf16").lost_updates is None  # not probed in a mixed run by default
    card = {a.label: a for a in answers(out, inspections=inspections)}["bf16-true"]
    assert any(line.startswith("against bf16 (mixed)") and "0.500×" in line for line in card.memory)
    assert any(f"{lost.updates_rounded_away:.1%} of the weights" in x for x in card.numerics)
    row = col.summary(out).set_index("run").loc["bf16-true"]
    assert row[col.MIXED_TWIN] == "bf16" and row[col.CAST_RATIO] == 0.5
    assert row[col.STATE_RATIO] == saving.ratio
    assert row[col.ROUNDED_AWAY] == lost.updates_rounded_away and row[col.LOST_STEP] == lost.step


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_the_probe_counts_elements_whose_bits_changed(dtype):
    from precision_nb.engine.update_probe import _moved

    before = torch.tensor([1.0, 0.0, float("nan"), 2.0, -3.0], dtype=dtype)
    assert int(_moved(before.clone(), before)) == 0  # the NaN left as it was is unchanged
    now = before.clone()
    now[1] = -0.0  # equal as a value, another bit pattern: the stored weight changed
    assert int(_moved(now, before)) == 1
    now[3] = 2.5
    assert int(_moved(now, before)) == 2
    complex_before = torch.tensor([1 + 1j, 2 + 0j], dtype=torch.complex128)
    assert int(_moved(complex_before * torch.tensor([1, 3]), complex_before)) == 1


def test_the_probe_counts_the_same_in_its_scratch_tensor():
    from precision_nb.engine.update_probe import _moved

    torch.manual_seed(0)
    start = torch.randn(1000).bfloat16()
    before = start.clone()
    before[:100] += 1
    now = before.clone()
    now[200:450] -= 1
    scratch = before.clone()
    in_step = _moved(now, scratch, scratch=scratch)  # the copy from before the step, overwritten
    since_start = _moved(now, start, scratch=scratch)
    assert (int(in_step), int(since_start)) == (250, 350)
    assert int(_moved(now, before)) == 250 and int(_moved(now, start)) == 350


def test_the_probe_counts_at_the_logging_point_not_inside_the_step(monkeypatch):
    """The counts read every parameter twice: they run when the record is taken, after the
    step's time; a step that begins first has the logged step's counts made before it moves."""
    from precision_nb.engine import update_probe

    calls: list[int] = []
    real = update_probe._moved
    monkeypatch.setattr(update_probe, "_moved", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    weight = torch.nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))
    opt = torch.optim.SGD([weight], lr=1.0)
    probe = update_probe.UpdateProbe(opt, [weight], ["w"], steps_before=0, steps=4, log_every=1)

    def step(update: float) -> None:
        weight.grad = torch.full_like(weight, -update)
        opt.step()

    step(1.0)  # a logged step: copied before, not yet counted
    assert calls == []
    assert probe.take()["updates_rounded_away"] == 0.0  # every element moved by 1.0
    assert len(calls) == 2  # moved in the step, moved since the start
    step(1.0)  # logged, not taken: the next step counts it before moving the weights
    step(1e-6)  # rounded away in bf16 (2 + 1e-6 is 2): this step's own counts replace it
    assert probe.take() == {"updates_rounded_away": 1.0, "weights_never_moved": 0.0}
    assert [h["step"] for h in probe.history] == [1, 3]
