"""What a measurement says about each compiled plan: its compile record, its speed against its
eager twin (the same paired interval as every other speedup), pay-back, agreement, graph breaks.

A compiled plan's *eager twin* is the plan of the same precision without compiling (``bf16`` for
``bf16+compile``), measured in the same rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from precision_nb.core.compile_mode import CompilePlan
from precision_nb.engine import stats, verdicts
from precision_nb.engine.compile.agreement import Agreement, agreement
from precision_nb.engine.compile.breaks import GraphBreaks
from precision_nb.engine.compile.payback import PayBack, pay_back
from precision_nb.engine.compile.record import CompileRecord
from precision_nb.engine.compile.visibility import Caveat, inspection_caveats

__all__ = ["CompiledPlanReport", "compile_reports"]


@dataclass(frozen=True)
class CompiledPlanReport:
    """Everything measured about one compiled plan, apart from its steady-state figures."""

    label: str
    eager_label: str | None
    record: CompileRecord
    speedup: stats.Speedup | None = None
    verdict: str = ""
    pay_back: PayBack | None = None
    agreement: Agreement | None = None
    breaks: GraphBreaks | None = None
    #: The resolved compile plan and the precision mode (what the inspection caveats name).
    compile_plan: CompilePlan | None = None
    precision: str = ""

    def caveats(self) -> tuple[Caveat, ...]:
        """What the op trace and memory inspection cannot see of this plan's compiled graph."""
        if self.compile_plan is None:
            return ()
        return inspection_caveats(self.compile_plan, self.precision or self.label)

    def lines(self) -> list[str]:
        """The report's sentences for this plan, compile first."""
        out = list(self.record.lines())
        if self.record.failure is not None:
            return out
        if self.eager_label is None:
            out.append(
                f"{self.label}: no eager plan of the same precision was measured, so there is no "
                "compiled-vs-eager speed, pay-back or agreement (measure compile off too)"
            )
        else:
            if self.verdict:
                out.append(self.verdict)
            if self.pay_back is not None:
                out.append(f"{self.label}: {self.pay_back.text}")
            if self.agreement is not None:
                out.append(self.agreement.message())
        if self.breaks is not None:
            out += self.breaks.lines()
        return out

    def row(self) -> dict[str, Any]:
        """A flat row for the summary table and CSV."""
        s = self.speedup
        pb = self.pay_back
        return {
            "plan": self.label,
            "eager_plan": self.eager_label,
            "compile_mode": self.record.mode,
            "compile_s": self.record.compile_s,
            "torch_compile_s": self.record.torch_compile_s,
            "compile_cache": self.record.cache,
            "recompiles": len(self.record.recompiles),
            "graph_breaks": len(self.breaks.forward.breaks) if self.breaks else None,
            "speedup_vs_eager": s.estimate if s else None,
            "speedup_vs_eager_low": s.low if s else None,
            "speedup_vs_eager_high": s.high if s else None,
            "pays_back": _pays_back_text(pb),
            "pays_back_after_steps": pb.steps if pb else None,
            "pays_back_low": pb.steps_low if pb else None,
            "pays_back_high": pb.steps_high if pb else None,
            "agrees_with_eager": self.agreement.agrees if self.agreement else None,
            "compile_failed": self.record.failure,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.row(),
            "record": self.record.to_dict(),
            "pay_back_text": self.pay_back.text if self.pay_back else None,
            "agreement": self.agreement.to_dict() if self.agreement else None,
            "breaks": self.breaks.rows() if self.breaks else [],
            "lines": self.lines(),
        }


def _pays_back_text(pb: PayBack | None) -> str:
    """The pay-back in a table cell: "never", "340", "340 (210-900)" or "340 (may never)"."""
    if pb is None:
        return ""
    if pb.steps is None:
        return "never"
    if pb.steps_high is None and pb.steps_low is not None:
        return f"{pb.steps} (may never)"
    if pb.steps_low is not None and pb.steps_low != pb.steps_high:
        return f"{pb.steps} ({pb.steps_low}-{pb.steps_high})"
    return str(pb.steps)


def compile_reports(
    measurement: Any,
    records: Mapping[str, CompileRecord],
    eager_labels: Mapping[str, str | None],
    losses: Mapping[str, Sequence[float]] | None = None,
    dtypes: Mapping[str, torch.dtype] | None = None,
    fp32_label: str | None = None,
    breaks: Mapping[str, GraphBreaks] | None = None,
    steps: Mapping[str, Sequence[int]] | None = None,
    plans: Mapping[str, tuple[CompilePlan, str]] | None = None,
) -> dict[str, CompiledPlanReport]:
    """One :class:`CompiledPlanReport` per compiled label of ``records``.

    ``measurement``: the interleaved measurement (``plans[label]`` with ``warmup`` and
    ``spread``; ``speedup(label, baseline)``). ``eager_labels``: compiled label -> its eager
    twin (None: not measured). ``losses``: label -> per-step losses (for agreement);
    ``dtypes``: label -> compute dtype; ``fp32_label``: the eager fp32 plan (a mixed plan's own
    drift). ``breaks``: label -> :class:`GraphBreaks`. ``steps``: label -> the 0-based step of each
    loss (default: one loss per step). ``plans``: label -> (its compile plan, its precision mode).
    """
    losses = losses or {}
    dtypes = dtypes or {}
    breaks = breaks or {}
    steps = steps or {}
    plans = plans or {}
    out: dict[str, CompiledPlanReport] = {}
    for label, record in records.items():
        timing = measurement.plans.get(label)
        steady = timing.spread.median if timing is not None and timing.spread.n else None
        eager = eager_labels.get(label)
        eager = eager if eager in measurement.plans else None  # a twin that was not measured: none
        speed = verdict = pb = agree = None
        if eager is not None and record.failure is None and timing is not None:
            speed = measurement.speedup(label, eager)
            verdict = str(
                verdicts.verdict(label, speed, baseline=eager, spread_of_plan=timing.spread)
            )
            if record.compile_s is not None and steady is not None:
                pb = pay_back(record.compile_s, steady, speed.estimate, speed.low, speed.high)
            if label in losses and eager in losses:
                dtype = dtypes.get(label, torch.float32)
                ref = losses.get(fp32_label) if fp32_label and fp32_label != eager else None
                found = breaks.get(label)
                random = found.forward.random_ops if found is not None else ()
                agree = agreement(
                    label, losses[label], eager, losses[eager], dtype, ref, steps.get(eager), random
                )
        out[label] = CompiledPlanReport(
            label=label,
            eager_label=eager,
            record=record,
            speedup=speed,
            verdict=verdict or "",
            pay_back=pb,
            agreement=agree,
            breaks=breaks.get(label),
            compile_plan=plans[label][0] if label in plans else None,
            precision=plans[label][1] if label in plans else "",
        )
    return out
