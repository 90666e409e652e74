"""A speedup in words: :func:`verdict` says "faster" / "slower" only where the interval excludes 1,
with the interval, its half-width, what it covers and how the measurement stopped; "no
difference this measurement can resolve" with what would resolve it otherwise; and why there is
no interval where there is none. Every number is worded by :mod:`precision_nb.core.text`, so
the report, the panel, the command line and a notebook show the same sentence. Without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from precision_nb.core.text import confidence_text, interval_text, times_text
from precision_nb.engine.stats import (
    CONFIDENCE,
    MEASURED_HERE,
    MIN_ROUNDS,
    ONE_LAUNCH,
    Speedup,
    Spread,
)

__all__ = ["NOISY_IQR", "PRACTICAL_PROCESSES", "PRACTICAL_ROUNDS", "Verdict", "verdict"]

#: Beyond this many rounds or processes the advice stops suggesting more of them.
PRACTICAL_ROUNDS = 200
PRACTICAL_PROCESSES = 60
#: A spread (IQR / median) above this makes "a larger model or batch" part of the advice.
NOISY_IQR = 0.25


@dataclass(frozen=True)
class Verdict:
    """What a speedup says, in words that stay true whatever the numbers are.

    ``kind``: "faster" / "slower" (the interval excludes 1), "unresolved" (it includes 1),
    "too_few" (no interval: too few rounds in one process), "none" (no times) or "baseline".
    ``text``: the one line to show first; ``advice``: what would resolve an unresolved or
    too-few verdict ("" otherwise). The other fields carry the speedup's numbers for tables (as
    :class:`~precision_nb.engine.stats.Speedup` names them) and ``busy`` (the machine-load note
    when other processes competed, "" on a quiet machine).
    """

    kind: str
    text: str
    advice: str = ""
    label: str = ""
    baseline: str = ""
    estimate: float = math.nan
    low: float | None = None
    high: float | None = None
    half_width: float | None = None
    confidence: float = CONFIDENCE
    method: str = ""
    level: str = ""
    processes: int = 0
    rounds: int = 0
    stopped_by: str = ""
    busy: str = ""

    def __str__(self) -> str:
        return f"{self.text} {self.advice}".strip()


def _scope(s: Speedup) -> str:
    if s.level == "processes":
        return f"over {s.processes} processes, {s.rounds} paired rounds in all"
    if s.stopped_by == ONE_LAUNCH:
        return f"{s.rounds} rounds in {ONE_LAUNCH}"
    here = s.stopped_by[s.stopped_by.find(MEASURED_HERE) :] if MEASURED_HERE in s.stopped_by else ""
    why = f"; {here}" if here else ""
    return (
        f"{s.rounds} rounds in one process, which does not cover process-to-process variation{why}"
    )


def _processes_advice(s: Speedup) -> str:
    """What measuring over processes would take, by what happened to this measurement."""
    if s.stopped_by == ONE_LAUNCH:
        return "several launches compared (one launch is one sample of their variation)"
    if MEASURED_HERE in s.stopped_by:
        return "a model and batches that can travel to fresh processes (see why they did not)"
    return "several fresh processes (processes >= 2)"


def _needed(s: Speedup) -> int | None:
    """Processes (or rounds) that would shrink the interval below the observed difference, with
    the usual 1/sqrt(n) scaling; None when the difference is too small to chase."""
    hw, diff = s.half_width, abs(math.log(s.estimate)) if s.estimate > 0 else 0.0
    if hw is None or diff < 0.01:
        return None
    n = s.processes if s.level == "processes" else s.rounds
    return math.ceil(n * (math.asinh(hw) / diff) ** 2) + 1


def verdict(
    label: str,
    s: Speedup,
    baseline: str = "fp32",
    spread_of_plan: Spread | None = None,
    busy: str = "",
) -> Verdict:
    """Words for ``s``, worded by :mod:`precision_nb.core.text`: e.g. "bf16 is 1.31× the fp32
    speed: faster (95 % interval 1.22–1.40, ±7 %; over 5 processes, 40 paired rounds in all)".
    ``busy``: the machine-load note; when set, the line says the machine was busy. The baseline
    itself (``label == baseline``) gets the "baseline" verdict."""
    if label == baseline:
        text = f"{label} is the baseline."
        return Verdict(
            "baseline", text, label=label, baseline=label, stopped_by=s.stopped_by, busy=busy
        )
    shared = ("estimate", "confidence", "method", "level", "processes", "rounds", "stopped_by")
    common = dict(label=label, baseline=baseline, busy=busy, **{f: getattr(s, f) for f in shared})
    tail = " Measured on a busy machine (see the load note)." if busy else ""
    if s.rounds == 0 or not math.isfinite(s.estimate):
        return Verdict(
            "none", f"{label}: no paired step times against {baseline}; no speedup.", **common
        )
    pct = confidence_text(s.confidence)
    if not s.has_interval:
        raw = ", ".join(f"{r:.2f}" for r in s.ratios)
        one = "one torchrun launch" if s.stopped_by == ONE_LAUNCH else "one process"
        return Verdict(
            "too_few",
            f"{label} vs {baseline}: {s.rounds} round(s) in {one} are too few for a {pct} "
            f"interval (at least {MIN_ROUNDS} are needed); per-round speed ratios: {raw}.{tail}",
            f"What would give one: at least {MIN_ROUNDS} rounds or {_processes_advice(s)}.",
            **common,
        )
    assert s.low is not None and s.high is not None
    common.update(low=s.low, high=s.high, half_width=s.half_width or 0.0)
    ci = f"({pct} interval {interval_text(s.low, s.high, s.estimate)}; {_scope(s)})"
    if s.low > 1 or s.high < 1:
        kind = "faster" if s.low > 1 else "slower"
        text = f"{label} is {times_text(s.estimate)} the {baseline} speed: {kind} {ci}.{tail}"
        return Verdict(kind, text, **common)
    advice = []
    needed = _needed(s)
    unit = "processes" if s.level == "processes" else "rounds"
    practical = PRACTICAL_PROCESSES if s.level == "processes" else PRACTICAL_ROUNDS
    current = s.processes if s.level == "processes" else s.rounds
    if needed is not None and current < needed <= practical:
        more = " (a larger time budget)" if unit == "processes" else ""
        advice.append(f"about {needed} {unit}{more}")
    elif needed is not None and needed <= current:
        advice.append(f"a few more {unit}")
    if s.level != "processes":
        advice.append(_processes_advice(s))
    noisy = spread_of_plan is not None and spread_of_plan.relative_iqr > NOISY_IQR
    advice.append(
        "a larger model or batch (step times spread widely)" if noisy else "a larger model or batch"
    )
    return Verdict(
        "unresolved",
        f"{label} vs {baseline}: no difference this measurement can resolve: "
        f"{times_text(s.estimate)} {ci}.{tail}",
        "What would resolve it: " + " or ".join(advice) + ".",
        **common,
    )
