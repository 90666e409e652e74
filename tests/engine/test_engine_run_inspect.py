"""``TrainConfig(inspect=True)``: one instrumented step on a copy before the first step, kept as
``RunResult.inspection``; training is the same with and without it."""

from __future__ import annotations

import json

import pytest
import torch
from engine_helpers import quiet
from torch import nn

from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.inspect import InspectionData
from precision_nb.engine.results import DeviceOutOfMemoryError
from precision_nb.engine.trainer import TrainConfig, Trainer

LAB = PrecisionConfig(mode="fp16", loss_scale_lab=True)


def _dropout_model() -> nn.Module:
    torch.manual_seed(3)  # dropout makes the run depend on the RNG stream
    return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.ReLU(), nn.Linear(16, 2))


def _fit(batches, precision=None, **cfg):
    model = _dropout_model()
    trainer = Trainer(model, batches, device="cpu", precision=precision, train=quiet(**cfg))
    return trainer.fit(), model


@pytest.mark.parametrize("precision", [None, "bf16", LAB], ids=["fp32", "bf16", "lab"])
def test_training_is_identical_with_and_without_inspection(batches, precision):
    plain, plain_model = _fit(batches, precision, steps=6, log_every=2, seed=5)
    inspected, model = _fit(batches, precision, steps=6, log_every=2, seed=5, inspect=True)
    assert plain.inspection is None
    assert [r["loss"] for r in inspected.records] == [r["loss"] for r in plain.records]
    assert inspected.scale_history == plain.scale_history
    for a, b in zip(model.parameters(), plain_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_inspection_is_of_this_run_and_travels_in_to_dict(batches):
    result, model = _fit(batches, "bf16", steps=2, log_every=1, inspect=True)
    data = result.inspection
    assert isinstance(data, InspectionData)
    assert data.plan == result.plan and not data.simulated and data.device == "cpu"
    params = sum(p.numel() * 4 for p in model.parameters())
    measured = {r["kind"]: r["bytes"] for r in data.memory if r["dtype"] == "fp32"}
    assert measured["parameters"] == params  # the run's model, fp32 master weights
    assert any(op["output"] == "bf16" and op["op"] == "addmm" for op in data.ops)  # the plan
    as_dict = result.to_dict()
    assert as_dict["inspection"] == data.to_dict()
    assert json.loads(json.dumps(as_dict))["inspection"]["plan"]["mode"] == "bf16"


class OutOfMemoryOnce(nn.Module):
    """Raises torch.OutOfMemoryError on the first forward (the inspection's, on the copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 1:
            raise torch.OutOfMemoryError("simulated: tried to allocate 64 GiB")
        return self.net(x)


def test_out_of_memory_in_the_inspection_gives_the_runs_message(batches):
    trainer = Trainer(OutOfMemoryOnce(), batches, device="cpu", train=quiet(inspect=True))
    with pytest.raises(DeviceOutOfMemoryError, match="out of memory on cpu with plan fp32") as err:
        trainer.fit()
    assert "inspection" in str(err.value)
    result = err.value.result
    assert result is not None and result.records == []
    oom = [e for e in result.events if e.kind == "oom"]
    assert len(oom) == 1 and oom[0].data["phase"] == "inspection"


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_bad_inspect_is_refused(bad):
    with pytest.raises(ValueError, match="train.inspect"):
        TrainConfig(inspect=bad)
