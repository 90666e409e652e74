import pytest
import torch
from engine_helpers import quiet
from torch import nn

from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.compare import compare


def test_cpu_comparison_merges_fp16_and_measures_drift():
    out = compare(("fp32", "bf16", "fp16"), "mlp", "tiny", train=quiet(steps=6, log_every=3))
    assert list(out.results) == ["fp32", "bf16"]
    assert out.merged == {"fp16": "fp32"}
    assert any(
        e.kind == "merged"
        and e.data["label"] == "fp16"
        and e.data["into"] == "fp32"
        and "GradScaler" in e.data["why"]
        for e in out.events
    )
    assert out.drift["fp32"] == {"final_loss_diff": 0.0, "param_rel_diff": 0.0}
    assert 0 < out.drift["bf16"]["param_rel_diff"] < 0.1
    assert {r["run"] for r in out.records} == {"fp32", "bf16"}


def test_runs_start_from_identical_weights_and_data():
    a = compare(("fp32", "bf16"), "cnn", "tiny", train=quiet(steps=3))
    b = compare(("bf16", "fp32"), "cnn", "tiny", train=quiet(steps=3))
    assert a.results["fp32"].final_loss == b.results["fp32"].final_loss
    assert a.results["bf16"].final_loss == b.results["bf16"].final_loss


def test_lab_run_next_to_fp32_with_own_model(make_model, batches):
    model = make_model()
    before = [p.clone() for p in model.parameters()]
    out = compare(
        ["fp32", PrecisionConfig(mode="fp16", loss_scale_lab=True)],
        model=model,
        batches=batches,
        train=quiet(steps=4, overflow_at_steps=(2,)),
    )
    lab = out.results["fp16 (loss-scale lab)"]
    assert lab.skipped_total == 1 and lab.steps == 4
    assert out.drift["fp16 (loss-scale lab)"]["param_rel_diff"] > 0
    assert any("ignored" in e.message for e in out.events)  # fp32 has no scaler to overflow
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_lab_label_only_where_the_lab_applies(make_model, batches):
    # The lab is a CPU fp16 opt-in; a lab flag on a request that resolves elsewhere (here CPU
    # bf16, like fp16 on CUDA) must not label the run as the lab.
    out = compare(
        [PrecisionConfig(mode="bf16", loss_scale_lab=True)],
        model=make_model(),
        batches=batches,
        train=quiet(steps=2),
    )
    assert list(out.results) == ["bf16"]
    assert any(
        e.kind == "fallback" and "applies to fp16 on CPU only" in e.message for e in out.events
    )


def test_bad_comparisons(make_model):
    with pytest.raises(ValueError, match="no precision requested"):
        compare(())
    with pytest.raises(ValueError, match="one-shot iterator"):
        compare(("fp32",), model=make_model(), batches=iter([torch.ones(2, 8)]))
    with pytest.raises(ValueError, match="batches is None"):
        compare(("fp32",), model=nn.Linear(8, 2))
    with pytest.raises(ValueError, match="precision.mode"):
        compare(("fp8",), train=quiet(steps=1))
    no_ref = compare(("bf16",), train=quiet(steps=2))
    assert (
        no_ref.drift["bf16"]["param_rel_diff"] is None
        and "no fp32 run" in no_ref.events[-1].message
    )
