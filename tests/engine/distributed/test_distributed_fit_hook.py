"""``fit(..., distributed=Distributed(...))`` hands its run request to the torchrun launcher."""

from __future__ import annotations

import dataclasses

import pytest

import precision_nb
from precision_nb.core.distributed import Distributed
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.distributed import DistributedResult
from precision_nb.engine.distributed import launcher as launcher_mod
from precision_nb.engine.trainer import TrainConfig


def test_every_argument_reaches_the_launcher_in_one_request(monkeypatch):
    seen = {}

    def fake(request, distributed, **kwargs):
        seen.update(request=request, distributed=distributed, kwargs=kwargs)
        return "launched"

    monkeypatch.setattr(launcher_mod, "launch", fake)
    request = Distributed("fsdp2", 2)
    train = TrainConfig(steps=3, progress=False)
    callbacks, stop = [object()], object()
    out = precision_nb.fit(
        "transformer", preset="small", device="cpu", precision="bf16", distributed=request,
        train=train, loss_fn="pkg.mod:loss", callbacks=callbacks, stop=stop,
        factory="pkg.mod:build", log_every=1,
    )  # fmt: skip
    assert out == "launched" and seen["distributed"] is request
    run = seen["request"]
    assert (run.model, run.batches, run.preset, run.device) == ("transformer", None, "small", "cpu")
    assert run.precision == PrecisionConfig("bf16") and run.optimizer == OptimizerConfig()
    assert run.train == dataclasses.replace(train, log_every=1) and run.loss_fn == "pkg.mod:loss"
    kw = seen["kwargs"]
    assert kw == dict(factory="pkg.mod:build", callbacks=callbacks, stop=stop)


@pytest.mark.parametrize("how", ["option", "train"])
def test_inspect_is_refused_with_distributed(how, monkeypatch):
    monkeypatch.setattr(launcher_mod, "_launch", pytest.fail)  # refused before torchrun starts
    extra = {"inspect": True} if how == "option" else {"train": TrainConfig(inspect=True)}
    with pytest.raises(ValueError, match="train.inspect"):
        precision_nb.fit("mlp", device="cpu", distributed=Distributed("ddp", 2), **extra)


def test_two_processes_train_and_measure_gradient_underflow():
    result = precision_nb.fit(
        "mlp", device="cpu", distributed=Distributed("ddp", 2, timeout_s=120), steps=2,
        log_every=1, measure_peak=False, grad_stats_every=1,
    )  # fmt: skip
    assert isinstance(result, DistributedResult)
    assert [r["step"] for r in result.records] == [1, 2]
    assert [r["nproc"] for r in result.records] == [2, 2]
    # after DDP's all-reduce both ranks hold the same gradients: the same underflow figures
    first = [rank.records[0] for rank in result.ranks]
    assert first[0]["grad_underflow"] is not None
    keys = ("grad_underflow", "grad_underflow_worst", "grad_overflow")
    assert [first[0][k] for k in keys] == [first[1][k] for k in keys]
