"""``TrainConfig(grad_stats_every=N)``: fp16 gradient underflow measured during a fit.

Values are checked against a direct computation (a real fp16 cast of the gradients the optimizer
step saw, captured by hooks); the sync test counts host reads as tests/engine/test_engine_sync.py.
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import quiet
from test_engine_sync import run, transfers  # noqa: F401 - the fixture
from torch import nn

from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.numerics.scale_window import cast_limits
from precision_nb.engine.results import RECORD_KEYS
from precision_nb.engine.trainer import TrainConfig, Trainer

LAB = PrecisionConfig(mode="fp16", loss_scale_lab=True)
STAT_KEYS = (
    "grad_underflow",
    "grad_underflow_worst",
    "grad_underflow_worst_param",
    "grad_overflow",
)


def _capture(model):
    """Record every parameter's gradient once it is final for the attempt (before the step)."""
    seen: list[dict[str, torch.Tensor]] = []
    names = {p: n for n, p in model.named_parameters()}

    def hook(p):
        if not seen or names[p] in seen[-1]:
            seen.append({})
        seen[-1][names[p]] = p.grad.detach().clone()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    return seen


def _direct(grads: dict[str, torch.Tensor]) -> dict:
    """Underflow by a real fp16 cast, per tensor and overall, and overflow."""
    under = live = over = 0
    worst, worst_name = 0.0, None
    for name, g in grads.items():
        nz = g != 0
        cast = g.to(torch.float16)
        u = int((nz & (cast == 0)).sum())
        n = int(nz.sum())
        under, live, over = under + u, live + n, over + int(torch.isinf(cast).sum())
        if n and u / n > worst:
            worst, worst_name = u / n, name
    return {
        "grad_underflow": under / live,
        "grad_underflow_worst": worst,
        "grad_underflow_worst_param": worst_name,
        "grad_overflow": over / live,
    }


class Elementwise(nn.Module):
    """Logits from elementwise ops only: autocast leaves them in fp32 on CPU, so the gradients
    are fp32 values (under the lab: times the loss scale) that an fp16 cast may flush."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 8))
        self.b = nn.Parameter(torch.randn(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spread = torch.logspace(-7, 0, 8)  # inputs over seven decades: some gradients tiny
        return (x[:, None, :] * spread * self.w).sum(-1) + self.b


def _fit(make_model, batches, loss_scale_factor, **cfg):
    """Fit ``make_model()``; the gradients of every attempt are captured after setup."""

    def loss_fn(out, y):
        return torch.nn.functional.cross_entropy(out, y) * loss_scale_factor

    model = make_model()
    trainer = Trainer(
        model, batches, device="cpu", precision=cfg.pop("precision", None), loss_fn=loss_fn,
        train=quiet(**cfg),
    )  # fmt: skip
    session = trainer.start()  # its FLOP-count pass runs a backward: capture after it
    seen = _capture(model)
    session.advance(trainer.train.steps)
    return session.finish(), seen


@pytest.mark.parametrize(
    ("precision", "factor", "init_scale"),
    [(LAB, 1e-3, 1.0), (LAB, 1e-3, 2.0**12), (LAB, 1e3, 2.0**16), (None, 1e-3, 1.0)],
    ids=["lab-scale-1", "lab-scale-4096", "lab-overflow", "fp32-unscaled"],
)
def test_values_match_a_direct_fp16_cast_of_the_gradients(batches, precision, factor, init_scale):
    result, seen = _fit(
        Elementwise, batches, factor, precision=precision, init_scale=init_scale,
        steps=2, log_every=1, grad_stats_every=1, min_loss_scale=2.0**-30,
    )  # fmt: skip
    assert len(result.grad_stats) == len(seen) == result.attempts
    for stats, grads in zip(result.grad_stats, seen, strict=True):
        expected = _direct(grads)
        got = {k: stats[k] for k in STAT_KEYS}
        assert got == pytest.approx(expected, abs=1e-7), (got, expected)
    # the record of each interval carries that interval's values
    last = result.grad_stats[-1]
    assert {k: result.records[-1][k] for k in STAT_KEYS} == {k: last[k] for k in STAT_KEYS}


def test_the_loss_scale_rescues_underflow_and_overflow_is_seen(batches):
    runs = {
        s: _fit(
            Elementwise, batches, 1e-3, precision=LAB, init_scale=s, steps=1, log_every=1,
            grad_stats_every=1,
        )[0].records[0]
        for s in (1.0, 2.0**12)
    }  # fmt: skip
    assert runs[1.0]["grad_underflow"] > 0.1  # tiny gradients flush to zero unscaled
    assert runs[1.0]["grad_underflow_worst_param"] == "w"
    assert runs[2.0**12]["grad_underflow"] < runs[1.0]["grad_underflow"]
    big, _ = _fit(
        Elementwise, batches, 1e3, precision=LAB, steps=1, log_every=1, grad_stats_every=1,
        init_scale=2.0**16,
    )  # fmt: skip
    # beyond fp16's range at this scale (these fp32 gradients are finite, so nothing was skipped)
    assert big.grad_stats[0]["grad_overflow"] > 0


def test_every_n_counted_steps_and_none_elsewhere(make_model, batches):
    result, _ = _fit(make_model, batches, 1.0, steps=20, log_every=5, grad_stats_every=10)
    assert [g["step"] for g in result.grad_stats] == [10, 20]
    assert [r["grad_underflow"] is None for r in result.records] == [True, False, True, False]
    assert all(tuple(r) == RECORD_KEYS for r in result.records)
    off, _ = _fit(make_model, batches, 1.0, steps=4, log_every=2)
    assert off.grad_stats == [] and all(r[k] is None for r in off.records for k in STAT_KEYS)


def test_measuring_does_not_change_training(make_model, batches):
    plain, _ = _fit(make_model, batches, 1.0, precision=LAB, steps=6, log_every=3)
    measured, _ = _fit(
        make_model, batches, 1.0, precision=LAB, steps=6, log_every=3, grad_stats_every=1
    )
    assert [r["loss"] for r in measured.records] == [r["loss"] for r in plain.records]
    assert measured.scale_history == plain.scale_history


@pytest.mark.parametrize("precision", [None, LAB])
@pytest.mark.parametrize("every", [1, 3])
def test_no_host_sync_beyond_the_logging_transfer(
    make_model,
    batches,
    transfers,  # noqa: F811 - the imported fixture
    precision,
    every,
):
    cast_limits("fp16")  # the one setup read, cached per process
    counts, result = run(
        make_model, batches, transfers, steps=10, accumulation=2, log_every=5, grad_clip=1.0,
        precision=precision, grad_stats_every=every,
    )  # fmt: skip
    assert len(result.grad_stats) == 10 // every
    assert counts["ours"] == 2  # one transfer per logging interval, stats included


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_grad_stats_every_is_refused(bad):
    with pytest.raises(ValueError, match="train.grad_stats_every"):
        TrainConfig(grad_stats_every=bad)
