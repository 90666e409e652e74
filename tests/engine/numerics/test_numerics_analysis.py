"""analyze(): one instrumented fp32 step on a copy, checked on small hand-built models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from precision_nb.core.optim import OptimizerConfig
from precision_nb.engine.numerics.analysis import analyze
from precision_nb.engine.numerics.formats import cast_counts


def data(n=16, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    return [(x, (x.sum(1) > 0).long())]


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(8, 2)
        self.unused = nn.Linear(8, 2)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.used(self.frozen(x))


def by(rows, **match):
    return [r for r in rows if all(r[k] == v for k, v in match.items())]


def test_caller_state_is_untouched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = data()
    for _ in range(2):  # optimizer state exists
        nn.functional.cross_entropy(model(batches[0][0]), batches[0][1]).backward()
        opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    state = {k: {n: v.clone() for n, v in s.items()} for k, s in enumerate(opt.state.values())}
    rng = torch.get_rng_state()
    result = analyze(model, batches, optimizer=opt, device="cpu")
    assert result.gradients and result.stagnation
    assert all(p.equal(q) for p, q in zip(model.parameters(), params, strict=True))
    assert all(p.grad.equal(g) for p, g in zip(model.parameters(), grads, strict=True))
    for k, s in enumerate(opt.state.values()):
        assert all(v.equal(state[k][n]) for n, v in s.items())
    assert torch.get_rng_state().equal(rng)
    assert "AdamW with its state" in result.info["optimizer"]


def test_unused_and_frozen_parameters_are_reported_as_such():
    result = analyze(Branchy(), data(), device="cpu")
    status = {r["layer"]: r["status"] for r in result.gradients}
    assert status["used.weight"] == "ok" and status["unused.weight"] == "no gradient"
    assert status["frozen.weight"] == "frozen"
    for r in by(result.gradients, layer="unused.weight"):
        assert r["underflow_fraction"] is None and r["underflow"] is None
    found = {e.data["finding"]: e.data for e in result.findings}
    assert found["no_gradient"]["layers"] == ["unused.weight", "unused.bias"]
    assert found["frozen"]["layers"] == ["frozen.weight", "frozen.bias"]
    assert by(result.stagnation, layer="unused.weight")[0]["lost_fraction"] is None


def test_nonfinite_gradients_are_a_finding_not_a_crash():
    model = nn.Sequential(nn.Linear(8, 2))
    result = analyze(model, data(), loss_fn=lambda out, y: out.sum() * float("nan"), device="cpu")
    kinds = {e.data["finding"] for e in result.findings}
    assert {"nonfinite_loss", "nonfinite_gradients", "no_window"} <= kinds
    row = by(result.gradients, layer="0.weight", variant="fp16")[0]
    assert row["nonfinite"] == 16 and row["live"] == 0 and row["underflow_fraction"] is None
    assert result.info["loss"] is None and result.window["lo"] is None


def test_counts_match_a_direct_cast_and_the_sweep_agrees_with_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    ref = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    ref.load_state_dict(model.state_dict())
    x, y = data()[0]
    tiny = 1e-7  # tiny gradients: fp16 underflows without a scale

    def loss_fn(out, labels):
        return nn.functional.cross_entropy(out, labels) * tiny

    result = analyze(model, [(x, y)], loss_fn=loss_fn, scale=2.0**12, device="cpu")
    loss_fn(ref(x), y).backward()
    for name, p in ref.named_parameters():
        for variant, scale in (("fp16", None), ("fp16 x2^12", 2.0**12)):
            row = by(result.gradients, layer=name, variant=variant)[0]
            c = cast_counts(p.grad, "fp16", scale).tolist()
            assert (row["zeros"], row["underflow"], row["subnormal"]) == (c[0], c[2], c[3])
    # sweep at 2^12 == the "fp16 x2^12" rows summed (parameters) and activations summed
    at = by(result.scale_window, log2_scale=12)[0]
    p_rows = by(result.gradients, variant="fp16 x2^12")
    p_under = sum(r["underflow"] for r in p_rows) / sum(r["live"] for r in p_rows)
    assert at["param_underflow_fraction"] == pytest.approx(p_under)
    a_rows = by(result.activations, variant="fp16 x2^12")
    a_under = sum(r["underflow"] for r in a_rows) / sum(r["live"] for r in a_rows)
    assert at["activation_underflow_fraction"] == pytest.approx(a_under)
    first = by(result.scale_window, log2_scale=0)[0]
    assert first["underflow_fraction"] > result.window["threshold"] and result.window["lo"] > 0
    inside = [r["log2_scale"] for r in result.scale_window if r["in_window"]]
    assert inside == list(range(result.window["lo"], result.window["hi"] + 1))


def test_activation_coverage_names_each_output_once():
    shared = nn.Linear(4, 4)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            self.shared = shared

        def forward(self, x):
            return self.shared(self.shared(self.body(x))).sum()

    result = analyze(Twice(), [torch.randn(3, 4)], device="cpu")
    layers = {r["layer"]: r for r in by(result.activations, variant="fp16")}
    # the Sequential returns its ReLU's output: counted once, under the ReLU; the loss is a
    # scalar the root returns (its gradient is 1)
    assert set(layers) == {"body.0", "body.1", "shared", "(model)"}
    assert layers["shared"]["calls"] == 2 and layers["shared"]["elements"] == 24


def test_fresh_adamw_first_step_stagnates_in_bf16_not_fp16():
    model = nn.Linear(8, 4, bias=False)
    nn.init.ones_(model.weight)
    x = torch.rand(16, 8) + 0.1  # every weight gets a non-zero gradient
    result = analyze(model, [x], loss_fn=lambda out: out.sum(), device="cpu")
    rows = {r["format"]: r for r in result.stagnation}
    # |update| ~ lr = 1e-3: below half a bf16 ulp at 1.0 (2^-8), above half an fp16 ulp (2^-11)
    assert rows["bf16"]["updated"] == 32 and rows["bf16"]["lost_fraction"] == 1.0
    assert rows["fp16"]["lost_fraction"] == 0.0
    small_lr = analyze(
        model, [x], loss_fn=lambda out: out.sum(), optimizer=OptimizerConfig(lr=1e-6)
    )
    assert {r["format"]: r["lost_fraction"] for r in small_lr.stagnation}["fp16"] == 1.0


def test_fp8_rows_cover_weights_activations_and_gradients():
    result = analyze("mlp", preset="tiny", formats=("fp8_e4m3",), device="cpu")
    tensors = {r["tensor"] for r in result.fp8}
    assert tensors == {"weight", "weight_grad", "activation", "activation_grad"}
    assert all(r["format"] == "fp8_e4m3" for r in result.fp8)
    assert all(0 <= r["rel_error"] < 0.1 for r in result.fp8 if r["rel_error"] is not None)
    assert {r["variant"] for r in result.gradients} == {"fp8_e4m3"}
    assert result.info["workload"]["name"] == "mlp"
    assert "simulation" in result.info["fp8"]["text"]
    assert result.info["overflow_behaviour"]["fp8_e4m3"] in ("saturates", "nan")


def test_16_bit_formats_alone_need_no_fp8_rows():
    result = analyze("mlp", preset="tiny", formats=("fp16", "bf16"), device="cpu")
    assert {r["variant"] for r in result.gradients} == {"fp16", "fp16 x2^16", "bf16"}
    assert {r["format"] for r in result.activations} == {"fp16", "bf16"}
    assert result.fp8 == []


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(formats=("fp4",)), "formats: invalid value 'fp4'"),
        (dict(formats=()), "formats"),
        (dict(scale=0), "scale: invalid value 0"),
        (dict(threshold=2), "threshold"),
        (dict(optimizer="adam"), "optimizer has type str"),
    ],
)
def test_bad_input_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        analyze(nn.Linear(8, 2), data(), **kwargs)


class EmbedNormLinear(nn.Module):
    """An embedding and a LayerNorm, which autocast keeps in fp32, before an fp16 Linear."""

    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.ln = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x):
        return self.out(self.ln(self.emb(x)))


def _tokens(vocab=64):
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (32, 16), generator=gen), torch.randint(0, vocab, (32, 16))


def test_fp16_run_marks_what_autocast_holds_in_fp16_and_the_window_counts_only_those():
    torch.manual_seed(0)
    model = EmbedNormLinear()
    x, y = _tokens()

    def loss_fn(out, labels):  # small gradients: fp16 underflow matters
        return nn.functional.cross_entropy(out.reshape(-1, 64).float(), labels.reshape(-1)) / 2**12

    result = analyze(model, [(x, y)], loss_fn=loss_fn, scale=2.0**10, device="cpu")
    held = {r["layer"]: r["fp16_run"] for r in by(result.gradients, variant="fp16")}
    assert held == {
        "emb.weight": "fp32",
        "ln.weight": "fp32",
        "ln.bias": "fp32",
        "out.weight": "fp16",
        "out.bias": "fp16",
    }
    outputs = {r["layer"]: r["fp16_run"] for r in by(result.activations, variant="fp16")}
    assert outputs == {"emb": "fp32", "ln": "fp32", "out": "fp16"}
    # a real fp16 backward: the fp32-held embedding loses far less than a cast predicts, the
    # fp16-held weight about what the cast predicts
    real = EmbedNormLinear()
    real.load_state_dict(model.state_dict())
    ref = EmbedNormLinear()
    ref.load_state_dict(model.state_dict())
    loss_fn(ref(x), y).backward()
    with torch.autocast("cpu", dtype=torch.float16):
        out = real(x)
    loss_fn(out, y).backward()
    fp32_grads = dict(ref.named_parameters())

    def lost(name):
        live = fp32_grads[name].grad != 0
        return float(((dict(real.named_parameters())[name].grad == 0) & live).sum() / live.sum())

    predicted = {r["layer"]: r["underflow_fraction"] for r in by(result.gradients, variant="fp16")}
    assert predicted["emb.weight"] > 0.1 and lost("emb.weight") < predicted["emb.weight"] / 4
    assert abs(lost("out.weight") - predicted["out.weight"]) < 0.01
    # the window row at 2^10 sums the fp16-held rows of the "fp16 x2^10" variant only
    fp16_rows = [
        r
        for r in by(result.gradients, variant="fp16 x2^10")
        + by(result.activations, variant="fp16 x2^10")
        if r["fp16_run"] == "fp16"
    ]
    at = by(result.scale_window, log2_scale=10)[0]
    under = sum(r["underflow"] for r in fp16_rows) / sum(r["live"] for r in fp16_rows)
    sub = sum(r["subnormal"] for r in fp16_rows) / sum(r["live"] for r in fp16_rows)
    assert at["underflow_fraction"] == pytest.approx(under)
    assert at["subnormal_fraction"] == pytest.approx(sub)
    every = by(result.gradients, variant="fp16 x2^10") + by(
        result.activations, variant="fp16 x2^10"
    )
    all_under = sum(r["underflow"] for r in every) / sum(r["live"] for r in every)
    assert at["all_underflow_fraction"] == pytest.approx(all_under)
    assert result.window["counted_tensors"] == len(fp16_rows) < result.window["tensors"]
    assert "holds in fp16" in result.window["basis"]
    assert result.info["fp16_run"]["error"] is None


def test_a_model_that_cannot_run_in_fp16_counts_every_gradient_and_says_so():
    class NoHalf(nn.Linear):
        def forward(self, x):
            if torch.is_autocast_enabled("cpu"):
                raise RuntimeError("no fp16 kernel for this op")
            return super().forward(x)

    result = analyze(NoHalf(8, 2), data(), device="cpu")
    found = {e.data["finding"]: e for e in result.findings}
    assert "no fp16 kernel" in found["fp16_trace_failed"].message
    assert all(r["fp16_run"] is None for r in result.gradients)
    assert result.window["basis"].startswith("every gradient")
    row = result.scale_window[0]
    assert row["underflow_fraction"] == row["all_underflow_fraction"]


def test_a_model_autocast_keeps_wholly_in_fp32_has_no_window_and_says_why():
    model = nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4))
    result = analyze(
        model, [torch.randint(0, 10, (6,))], loss_fn=lambda out: out.sum(), device="cpu"
    )
    assert {r["fp16_run"] for r in result.gradients} == {"fp32"}
    assert result.window["lo"] is None and result.window["counted_tensors"] == 0
    assert "holds no gradient in fp16" in result.window["reason"]
    (no_window,) = [e for e in result.findings if e.data["finding"] == "no_window"]
    assert "nothing to protect" in no_window.message
