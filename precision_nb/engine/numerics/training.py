"""Gradient underflow during training: computed on the device, read with the logging transfer.

:func:`grad_underflow_stats` makes no host sync (no ``.item()``, no tensor truth test, no copy to
the host): every result is a device tensor, to be stacked with the other per-step values a
training loop brings home once per logging interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from precision_nb.engine.numerics.formats import format_name
from precision_nb.engine.numerics.scale_window import cast_limits

#: Keys of the mapping :func:`grad_underflow_stats` returns.
STAT_KEYS: tuple[str, ...] = ("underflow", "worst_underflow", "worst_index", "overflow")


def grad_underflow_stats(
    grads: Sequence[torch.Tensor | None],
    scale: torch.Tensor | float | None = None,
    fmt: str = "fp16",
) -> dict[str, torch.Tensor]:
    """Underflow of ``grads * scale`` cast to ``fmt``, on the device, without a host sync.

    ``grads``: gradient tensors (``p.grad`` of a parameter list; ``None`` entries are skipped but
    keep their index). ``scale``: a loss-scale tensor on the device (the grad scaler's own
    ``_scale``), a float, or ``None`` for gradients that are already scaled (read them before
    ``scaler.unscale_``). Elements are counted among the non-zero ones (inf and NaN included).
    The limits are divided by the scale instead of multiplying every gradient (one pass less):
    exact for a power-of-two scale (GradScaler's defaults keep it one); otherwise a value within
    one fp32 rounding of a limit may be classed differently from a cast of ``g * scale``.

    Returns 0-dim device tensors: ``underflow`` (fraction of all non-zero elements whose cast is
    zero, float32), ``worst_underflow`` (the largest per-tensor fraction), ``worst_index`` (its
    index in ``grads``, int64; -1 when there is no gradient; any layer when nothing underflows)
    and ``overflow`` (fraction whose cast overflows). Cost: five elementwise kernels per
    gradient (a count, abs, two compares with counts); no extra gradient copy is kept (one
    temporary the size of the tensor at hand).
    """
    u, o = cast_limits(format_name(fmt, "fmt"))
    device = next((g.device for g in grads if g is not None), None)
    if device is None:
        device = scale.device if isinstance(scale, torch.Tensor) else torch.device("cpu")
    zero_f = torch.zeros((), device=device)
    absent = torch.full((), -1.0, device=device)  # never the worst
    if isinstance(scale, torch.Tensor):
        s: torch.Tensor | float = scale.detach().float().reshape(())
    else:
        s = 1.0 if scale is None else float(scale)
    u_s, o_s = u / s, o / s
    fractions: list[torch.Tensor] = []
    under_total = live_total = over_total = zero_f
    for g in grads:
        if g is None:
            fractions.append(absent)
            continue
        g = g.detach()
        live = torch.count_nonzero(g)
        a = g.abs()
        # |g| <= U / s also holds for the zeros: remove them
        under = torch.count_nonzero(a <= u_s) - (g.numel() - live)
        over_total = over_total + torch.count_nonzero(a >= o_s)
        under_total = under_total + under
        live_total = live_total + live
        fractions.append(under / live.clamp_min(1))
    if all(g is None for g in grads):
        return {
            "underflow": zero_f,
            "worst_underflow": zero_f,
            "worst_index": torch.full((), -1, dtype=torch.int64, device=device),
            "overflow": zero_f,
        }
    worst, at = torch.stack(fractions).max(0)
    denominator = live_total.clamp_min(1)
    return {
        "underflow": (under_total / denominator).float(),
        "worst_underflow": worst.float(),
        "worst_index": at,
        "overflow": (over_total / denominator).float(),
    }
