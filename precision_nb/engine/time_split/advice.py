"""What would make a plan faster, read from its time split: each advice carries its figure.

No advice is given without the measurement behind it:

- ``outside_ops``: the share of the profiled step in no op (Python, dispatch, launches; on CUDA
  the GPU idle between kernels) is at least :data:`OUTSIDE_SHARE`: precision changes arithmetic,
  not this part, so it bounds the speedup any precision can give (at most 1 / share);
- ``casts``: casts take at least :data:`CAST_SHARE` of the step: their time and the bytes they
  write per step, read from the trace's shapes and dtypes;
- ``unaligned``: low-precision matmuls whose (M, K, N) from the trace are not multiples of 8
  take at least :data:`UNALIGNED_SHARE` of the matmul time (tensor cores want multiples of 8 for
  fp16/bf16: NVIDIA's matmul performance guide, a documented rule, not measured here);
- ``emulated_bf16``: bf16 without native hardware support (read from the capabilities or the
  CPU's features by the caller) with the matmul time against the baseline's;
- ``optimizer``: the optimizer step takes at least :data:`OPTIMIZER_SHARE` of the step with
  plain AdamW, and fused AdamW measured faster on the model's own parameters
  (:func:`~precision_nb.engine.adamw_timing.time_adamw`: its interval above 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from precision_nb.core.text import TIMES, interval_text, times_text
from precision_nb.engine.time_split.profiling import TimeSplit
from precision_nb.engine.time_split.reconcile import PlanDifference, ms

OUTSIDE_SHARE = 0.30
CAST_SHARE = 0.05
UNALIGNED_SHARE = 0.10
OPTIMIZER_SHARE = 0.15
#: fp16/bf16 matmul dims should be multiples of this for tensor cores (NVIDIA's guide).
ALIGN = 8
_LOW = ("c10::BFloat16", "c10::Half")


@dataclass(frozen=True)
class Advice:
    """One thing that would make the plan faster: ``kind``, the sentence, and its figures."""

    label: str
    kind: str
    message: str
    figures: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.label}: {self.message}"


@dataclass(frozen=True)
class PlanFacts:
    """What the comparison and the advice read from a plan's trainer besides its split: words on
    its optimizer, why its bf16 is emulated (or None), whether its AdamW was fused, and the
    plain-against-fused AdamW timing where the optimizer advice wants it (else None)."""

    optimizer: str | None = None
    emulated: str | None = None
    fused: bool = False
    adamw: Any = None


def wants_adamw_timing(split: TimeSplit, fused: bool | None) -> bool:
    """Whether the optimizer advice needs :func:`time_adamw`: plain AdamW and an optimizer
    step of at least :data:`OPTIMIZER_SHARE` of the step."""
    return split.available and fused is False and split.share("optimizer") >= OPTIMIZER_SHARE


def advise(
    split: TimeSplit,
    difference: PlanDifference | None = None,
    *,
    emulated: str | None = None,
    fused: bool | None = None,
    adamw: Any = None,
) -> tuple[Advice, ...]:
    """The advice for one plan's split. ``emulated``: where bf16 is emulated, what says so;
    ``fused``: whether the plan's AdamW was fused; ``adamw``: an
    :class:`~precision_nb.engine.adamw_timing.AdamWTiming` of the model's parameters."""
    if not split.available:
        return ()
    found = [
        _outside(split),
        _casts(split),
        _unaligned(split),
        _emulated(split, difference, emulated),
        _optimizer(split, fused, adamw),
    ]
    return tuple(a for a in found if a is not None)


def _outside(split: TimeSplit) -> Advice | None:
    share = split.share("other")
    if share < OUTSIDE_SHARE:
        return None
    where, fix = "no op was running", "larger batches or torch.compile (fewer, fused ops) shrink it"
    if "cuda" in split.device:
        where = "the GPU sat idle between kernels"
        fix = "CUDA graphs (compile mode 'reduce-overhead') or larger batches launch less often"
    return Advice(
        split.label,
        "outside_ops",
        f"for {share:.0%} of the profiled step ({ms(split.families['other'])}) {where} "
        "(Python, dispatch, launches): precision changes the ops, not this part, so no "
        f"precision can make this step more than {times_text(1 / share, '.2g')} faster; {fix}.",
        {"share": share, "seconds": split.families["other"], "bound": 1 / share},
    )


def _casts(split: TimeSplit) -> Advice | None:
    share = split.share("casts")
    if share < CAST_SHARE:
        return None
    c = split.casts
    return Advice(
        split.label,
        "casts",
        f"casts take {ms(split.families['casts'])} per step ({share:.0%}): {c.count:.0f} casts "
        f"writing {c.nbytes / 2**20:.2f} MiB per step, {c.autocast_count:.0f} of them "
        f"({c.autocast_nbytes / 2**20:.2f} MiB) autocast's. Weights are cast again in every "
        "forward; activations are cast where an op autocast keeps in fp32 (norms, softmax, "
        "losses) sits between low-precision matmuls. Low-precision weights (e.g. a bf16 AdamW "
        "with stochastic rounding) remove the weight casts.",
        {"share": share, "seconds": split.families["casts"], "casts": c.count,
         "bytes": c.nbytes, "autocast_casts": c.autocast_count,
         "autocast_bytes": c.autocast_nbytes},
    )  # fmt: skip


def _unaligned(split: TimeSplit) -> Advice | None:
    total = sum(m.seconds for m in split.matmuls)
    low = [m for m in split.matmuls if m.dtype in _LOW]
    bad = [m for m in low if any(d is not None and d % ALIGN for d in (m.m, m.k, m.n))]
    spent = sum(m.seconds for m in bad)
    if not bad or total <= 0 or spent / total < UNALIGNED_SHARE:
        return None
    shapes = ", ".join(f"{m.op} ({'-' if m.m is None else m.m}, {m.k}, {m.n})" for m in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return Advice(
        split.label,
        "unaligned",
        f"{spent / total:.0%} of the matmul time ({ms(spent)}) is in fp16/bf16 matmuls whose "
        f"(M, K, N) are not all multiples of {ALIGN}: {shapes}{more}. Tensor cores want "
        f"multiples of {ALIGN} for fp16/bf16 (NVIDIA's matmul performance guide, a documented "
        "rule); pad the batch, hidden or vocabulary size.",
        {"share_of_matmul": spent / total, "seconds": spent,
         "shapes": [(m.op, m.m, m.k, m.n, m.dtype) for m in bad]},
    )  # fmt: skip


def _emulated(split: TimeSplit, diff: PlanDifference | None, why: str | None) -> Advice | None:
    c = diff.change("matmul") if diff is not None else None
    if why is None or c is None:
        return None
    there = "no ratio"
    if c.times_faster:
        there = f"{times_text(c.times_faster, '.2g')} the baseline's speed there"
    return Advice(
        split.label,
        "emulated_bf16",
        f"bf16 is emulated here ({why}): matmuls took {ms(c.plan_s)} against the baseline's "
        f"{ms(c.baseline_s)} ({there}); fp16 with a loss scaler, or fp32, is the faster choice "
        "on this hardware.",
        {"matmul_s": c.plan_s, "baseline_matmul_s": c.baseline_s, "source": why},
    )


def _optimizer(split: TimeSplit, fused: bool | None, adamw: Any) -> Advice | None:
    if adamw is None or not wants_adamw_timing(split, fused):
        return None
    if adamw.ratio is None or adamw.ratio_low is None or adamw.ratio_low <= 1:
        return None
    share = split.share("optimizer")
    spent = ms(split.families["optimizer"])
    return Advice(
        split.label,
        "optimizer",
        f"the optimizer step is {share:.0%} of the profiled step ({spent}) "
        f"with plain AdamW; fused AdamW measured {times_text(adamw.ratio, '.2g')} faster per step "
        "on this model's parameters, timed apart from the training step (time_adamw: "
        f"{ms(adamw.plain_s)} against {ms(adamw.fused_s)} per optimizer step, quartiles of its "
        f"rounds {interval_text(adamw.ratio_low, adamw.ratio_high, spec='.2g')}{TIMES}): "
        "pass fused=True.",
        {"share": share, "seconds": split.families["optimizer"], "plain_s": adamw.plain_s,
         "fused_s": adamw.fused_s, "ratio": adamw.ratio},
    )  # fmt: skip
