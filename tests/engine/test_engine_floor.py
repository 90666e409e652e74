"""The loss-scale floor stops a run before any attempt runs at a scale below it (0 included)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import quiet

from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.results import LossScaleFloorError
from precision_nb.engine.trainer import Trainer

LAB = PrecisionConfig(mode="fp16", loss_scale_lab=True)


def test_an_attempt_at_scale_zero_never_runs_so_the_weights_stay_finite(make_model, batches):
    # 2**-140 halves to fp32's smallest subnormal (2**-149) after 9 skips and to 0.0 after the
    # 10th; attempt 11 is clean, and at scale 0 its unscale (x 1/0) would write NaN weights
    # (torch's inf check passes: the gradients are 0 before unscaling).
    cfg = quiet(
        steps=20, log_every=100, init_scale=2.0**-140, min_loss_scale=1e-300,
        overflow_at_steps=tuple(range(1, 11)),
    )  # fmt: skip
    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=cfg)
    before = [p.detach().clone() for p in t.model.parameters()]
    with pytest.raises(
        LossScaleFloorError, match=r"fell below the floor: 0 after attempt 10 "
    ) as info:
        t.fit()
    result = info.value.result
    assert result.attempts == 10 and t.attempts_done == 10  # attempt 11 never ran
    assert [h["loss_scale"] for h in result.scale_history][-1] == 2.0**-149
    assert all(torch.isfinite(p).all() for p in t.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, t.model.parameters(), strict=True))
    event = result.events[-1]
    assert event.kind == "scaler" and event.data["scale"] == 0.0 and event.data["attempt"] == 10
    assert "NaN" in event.message  # says why a scale of 0 must not step


def test_mid_interval_the_run_stops_at_the_crossing_not_at_the_logging_point(make_model, batches):
    # scale 8 -> 4 -> 2 -> 1 -> 0.5 over attempts 3-6; logging only every 50 steps
    cfg = quiet(steps=40, log_every=50, init_scale=8.0, overflow_at_steps=(3, 4, 5, 6))
    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=cfg)
    with pytest.raises(LossScaleFloorError, match="0.5 after attempt 6 ") as info:
        t.fit()
    assert info.value.result.attempts == 6 and t.attempts_done == 6  # no attempt ran after
    assert info.value.result.steps == 2
    assert [r["step"] for r in info.value.result.records] == [2]  # kept, in a partial record


def test_a_checkpointed_scale_below_the_floor_stops_before_the_first_attempt(
    tmp_path, make_model, batches
):
    low = Trainer(
        make_model(), batches, device="cpu", precision=LAB,
        train=quiet(steps=2, init_scale=0.5, min_loss_scale=0.25),
    )  # fmt: skip
    low.fit()
    low.save_checkpoint(tmp_path / "low.pt")
    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=quiet(steps=3))
    t.load_checkpoint(tmp_path / "low.pt")
    weights = [p.detach().clone() for p in t.model.parameters()]
    with pytest.raises(LossScaleFloorError, match="0.5 before attempt 3 ran") as info:
        t.fit()
    assert info.value.result.attempts == 0 and t.attempts_done == 2
    assert all(torch.equal(a, b) for a, b in zip(weights, t.model.parameters(), strict=True))
