"""Sync discipline on CPU: count tensor -> host transfers made by the engine during a fit.

Every way a tensor's value reaches Python is patched (item, tolist, cpu, numpy, float/int/bool
conversions). Calls made from precision_nb code are the engine's syncs; they must equal the number
of logging intervals (one transfer each), whatever the accumulation or the number of steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from engine_helpers import quiet

from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.trainer import Trainer

PACKAGE = str(Path(__import__("precision_nb").__file__).parent)
METHODS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")


@pytest.fixture
def transfers(monkeypatch):
    counts = {"ours": 0, "all": 0}

    def wrap(name):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, **kwargs):
            counts["all"] += 1
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(PACKAGE):
                counts["ours"] += 1
            return original(self, *args, **kwargs)

        return counted

    for name in METHODS:
        monkeypatch.setattr(torch.Tensor, name, wrap(name))
    return counts


def run(make_model, batches, transfers, **cfg):
    precision = cfg.pop("precision", None)
    trainer = Trainer(make_model(), batches, device="cpu", precision=precision, train=quiet(**cfg))
    transfers.update(ours=0, all=0)
    result = trainer.fit()
    return dict(transfers), result


@pytest.mark.parametrize("precision", [None, PrecisionConfig(mode="fp16", loss_scale_lab=True)])
def test_one_transfer_per_logging_interval(make_model, batches, transfers, precision):
    seen = {}
    for steps, k in [(10, 1), (10, 3), (20, 1), (20, 2)]:
        counts, result = run(
            make_model,
            batches,
            transfers,
            steps=steps,
            accumulation=k,
            log_every=5,
            grad_clip=1.0,
            precision=precision,
        )
        intervals = steps // 5
        assert len(result.records) == intervals
        assert counts["ours"] == intervals, (steps, k, counts)
        seen[(steps, k)] = counts["all"]
    # torch's own reads (if any) scale with optimizer steps, never with microbatches
    assert seen[(10, 1)] == seen[(10, 3)] and seen[(20, 1)] == seen[(20, 2)]


def test_skip_nonfinite_is_the_documented_per_step_exception(make_model, batches, transfers):
    counts, _ = run(make_model, batches, transfers, steps=20, log_every=10, skip_nonfinite=True)
    assert counts["ours"] == 2 + 20  # one per interval + one check per step (opt-in)


def test_the_counter_sees_a_sync(make_model, batches, transfers):
    trainer = Trainer(make_model(), batches, device="cpu", train=quiet(steps=2))
    transfers.update(ours=0, all=0)
    trainer.fit()
    before = transfers["ours"]
    trainer.scale_value()  # no scaler: returns None without reading anything
    torch.ones(1).item()
    assert transfers["all"] > 0 and transfers["ours"] == before
