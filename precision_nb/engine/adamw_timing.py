"""Plain against fused AdamW, per optimizer step, on a model's own parameter shapes.

The resolution rules leave fused AdamW off wherever the CUDA probe does not pass, CPU included,
although torch ships a CPU fused AdamW. What that costs depends on the device, the tensor sizes
and the threads, so :func:`time_adamw` measures it instead of asserting it: two copies of the
trainable parameters (fresh gradients, fresh optimizer state) get one plain and one fused AdamW
with the same settings, and blocks of optimizer steps of each are timed in alternating order,
round after round (paired rounds: a machine that gets busier slows both alike). Each figure comes
with its spread over the rounds. Only ``optimizer.step()`` is timed; the rest of a training step
costs the same with either.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from precision_nb.core.device import resolve_device
from precision_nb.core.optim import FUSED_ERRORS, OptimizerConfig
from precision_nb.core.text import interval_text, times_text
from precision_nb.core.validate import number, positive_int


@dataclass(frozen=True)
class AdamWTiming:
    """Seconds per ``optimizer.step()`` of plain and fused AdamW, medians over ``rounds`` with
    their interquartile ranges, and the median of the per-round ratios plain / fused with the
    quartiles of those ratios (``ratio_low``, ``ratio_high``). ``fused_error``: why fused AdamW
    could not be built (its figures are then ``None``)."""

    device: str
    tensors: int
    elements: int
    rounds: int
    steps_per_round: int
    plain_s: float
    plain_iqr_s: float
    fused_s: float | None = None
    fused_iqr_s: float | None = None
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    fused_error: str | None = None

    def summary(self) -> str:
        """One sentence that holds whatever the numbers are."""
        head = (
            f"AdamW step on {self.device} for {self.tensors} tensors ({self.elements:,} "
            f"elements), median of {self.rounds} paired rounds of {self.steps_per_round} steps: "
            f"plain {self.plain_s * 1e3:.3f} ms (IQR {self.plain_iqr_s * 1e3:.3f} ms)"
        )
        if self.fused_s is None or self.ratio is None:
            return f"{head}; fused AdamW could not be built ({self.fused_error})."
        return (
            f"{head}, fused {self.fused_s * 1e3:.3f} ms (IQR {self.fused_iqr_s * 1e3:.3f} ms); "
            f"plain / fused {times_text(self.ratio)} (per-round quartiles "
            f"{interval_text(self.ratio_low, self.ratio_high)})."
        )


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    low, mid, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, mid, high


def _twin(params: list[nn.Parameter], device: torch.device, seed: int) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for p in params:
        q = nn.Parameter(p.detach().to(device, copy=True))
        q.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype).to(device)
        out.append(q)
    return out


def time_adamw(
    model: nn.Module,
    device: Any = "auto",
    config: OptimizerConfig | None = None,
    *,
    rounds: int = 7,
    seconds: float = 0.02,
) -> AdamWTiming:
    """Time ``optimizer.step()`` of plain and of fused AdamW on copies of ``model``'s trainable
    parameters on ``device`` (see the module docstring). ``seconds``: the least time one block of
    steps takes (the steps per block are set from one timed step). ``config``: lr, betas, eps and
    weight decay (its ``fused`` field is ignored: both are timed)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model has type {type(model).__name__}; allowed: a torch.nn.Module")
    rounds = positive_int("rounds", rounds)
    seconds = number("seconds", seconds, minimum=0.0, strict=True)
    cfg = config if config is not None else OptimizerConfig()
    if not isinstance(cfg, OptimizerConfig):
        raise ValueError(f"config has type {type(cfg).__name__}; allowed: an OptimizerConfig")
    dev = resolve_device(device)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model: has no trainable parameters (requires_grad=True) to time")
    kwargs = {"lr": cfg.lr, "betas": cfg.betas, "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    plain = torch.optim.AdamW(_twin(params, dev, 0), **kwargs)
    fused: torch.optim.Optimizer | None = None
    error = None
    try:
        fused = torch.optim.AdamW(_twin(params, dev, 0), fused=True, **kwargs)
        fused.step()  # the state is made outside the timing; a kernel that fails fails here
    except FUSED_ERRORS as exc:
        fused, error = None, f"{type(exc).__name__}: {exc}"
    plain.step()

    def block(opt: torch.optim.Optimizer, steps: int) -> float:
        _sync(dev)
        start = time.perf_counter()
        for _ in range(steps):
            opt.step()
        _sync(dev)
        return (time.perf_counter() - start) / steps

    one = block(plain, 1)
    steps = max(1, math.ceil(seconds / max(one, 1e-9)))
    plain_t: list[float] = []
    fused_t: list[float] = []
    for r in range(rounds):
        order = [(plain, plain_t), (fused, fused_t)]
        for opt, sink in order if r % 2 == 0 else order[::-1]:
            if opt is not None:
                sink.append(block(opt, steps))
    p_low, p_mid, p_high = _quartiles(plain_t)
    size = sum(p.numel() for p in params)
    head = (str(dev), len(params), size, rounds, steps, p_mid, p_high - p_low)
    if not fused_t:
        return AdamWTiming(*head, fused_error=error)
    f_low, f_mid, f_high = _quartiles(fused_t)
    r_low, r_mid, r_high = _quartiles([a / b for a, b in zip(plain_t, fused_t, strict=True)])
    return AdamWTiming(*head, f_mid, f_high - f_low, r_mid, r_low, r_high)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
