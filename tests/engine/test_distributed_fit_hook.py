"""``fit(..., distributed=Distributed(...))`` hands the run to ``fit_distributed``."""

from __future__ import annotations

import pytest

import precision_nb
from precision_nb.core.distributed import Distributed
from precision_nb.engine.distributed import DistributedResult
from precision_nb.engine.distributed import launcher as launcher_mod
from precision_nb.engine.trainer import TrainConfig


def test_every_argument_reaches_fit_distributed(monkeypatch):
    seen = {}

    def fake(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        return "launched"

    monkeypatch.setattr(launcher_mod, "fit_distributed", fake)
    request = Distributed("fsdp2", 2)
    train = TrainConfig(steps=3, progress=False)
    callbacks, stop = [object()], object()
    out = precision_nb.fit(
        "transformer", preset="small", device="cpu", precision="bf16", distributed=request,
        train=train, loss_fn="pkg.mod:loss", callbacks=callbacks, stop=stop,
        factory="pkg.mod:build", log_every=1,
    )  # fmt: skip
    assert out == "launched"
    assert seen["args"] == ("transformer", None)
    kw = seen["kwargs"]
    assert kw.pop("distributed") is request and kw.pop("train") is train
    assert kw.pop("callbacks") is callbacks and kw.pop("stop") is stop
    assert kw == dict(
        preset="small", device="cpu", precision="bf16", optimizer=None,
        loss_fn="pkg.mod:loss", factory="pkg.mod:build", log_every=1,
    )  # fmt: skip


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
