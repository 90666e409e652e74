"""``Profile``: what :func:`precision_nb.profile` returns; shows itself in a notebook, saves.

In a notebook it opens with one card per plan (the verdict with its interval first), then the
summary, the hints, the dashboard and the rest. The settings table names what the numbers were
measured on (model, device, torch, CPU and GPU facts, TF32 state), how (warm-up rule, rounds,
steps per block) and ends with "what to try next", drawn from the hints.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from precision_nb.core.cpu_features import read_cpu_features
from precision_nb.core.text import fmt, times_text
from precision_nb.engine.compare import Comparison
from precision_nb.views.report import tables as col
from precision_nb.views.report.answer import PlanAnswer, answers, cards_html, other_hints
from precision_nb.views.report.figure_base import figure_to_png
from precision_nb.views.report.hint import capabilities_of
from precision_nb.views.report.hints import Hint, what_to_try_next
from precision_nb.views.report.html import make_figures, write_report
from precision_nb.views.report.inspection import inspection_html
from precision_nb.views.report.markup import details, img_html
from precision_nb.views.report.numerics import Numerics
from precision_nb.views.report.profile_distributed import distributed_html
from precision_nb.views.report.time_split import TITLE as TIME_TITLE
from precision_nb.views.report.time_split import time_split_html, time_split_lines

__all__ = ["Profile", "measurement_settings"]

#: Summary columns shown in a notebook (every column is in summary.csv).
NOTEBOOK_COLUMNS = (
    "run",
    col.MEDIAN_STEP,
    col.STEP_IQR,
    col.SPEEDUP,
    col.CI_LOW,
    col.CI_HIGH,
    "rounds",
    col.WARMUP_STEPS,
    col.WARMUP_S,
    "samples_per_s",
    "mfu",
    "final_loss",
    col.PEAK_MIB,
)
#: A true plan's columns, shown in a notebook when a plan has them.
NOTEBOOK_TRUE_COLUMNS = (col.STATE_RATIO, col.ROUNDED_AWAY)


@dataclass
class Profile:
    """A profile: the comparison, its summary table, hints and settings; ``save`` writes a folder.

    ``out_dir`` / ``files`` are set once the folder is written (by ``save`` or ``out=``).
    """

    comparison: Comparison
    summary: Any
    hints: tuple[Hint, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    out_dir: Path | None = None
    files: dict[str, Path] = field(default_factory=dict)
    #: Label -> ``InspectionData`` of each plan (memory by kind and dtype, op dtype trace).
    inspections: dict[str, Any] = field(default_factory=dict)
    #: The :class:`~precision_nb.views.report.numerics.Numerics` of the model, or None.
    numerics: Numerics | None = None
    #: The ``DistributedResult`` of each plan (label -> result) for a distributed profile.
    distributed: dict[str, Any] = field(default_factory=dict)
    #: Rewrites report.html's text for its reader (the command line: its flags for Python names).
    wording: Callable[[str], str] | None = field(default=None, repr=False, compare=False)

    @property
    def load_note(self) -> str:
        """On a busy machine, the sentence to show before any figure ("" on a quiet one)."""
        return self.comparison.load_note

    @property
    def verdicts(self) -> dict[str, str]:
        """Label -> the verdict in words (from the interleaved measurement)."""
        return {a.label: a.verdict.text for a in self.answers() if a.verdict is not None}

    @property
    def time_split(self) -> Any:
        """The step time by op family per plan and each plan against the baseline
        (:class:`~precision_nb.engine.time_split.TimeAnalysis`), or None when not profiled."""
        return self.comparison.time_split

    def answers(self) -> list[PlanAnswer]:
        """One :class:`~precision_nb.views.report.answer.PlanAnswer` per plan (verdict first)."""
        return answers(self.comparison, inspections=self.inspections, numerics=self.numerics)

    def save(self, path: str | Path, *, stop: Any = None) -> dict[str, Path]:
        """Write the report folder the CLI writes (created if missing; a file there is refused),
        all at once or not at all, ``stop`` included (:func:`~.folder.write_files`)."""
        out = Path(path).expanduser()
        self.files = write_report(
            self.comparison,
            out,
            stop=stop,
            settings=self.settings,
            inspections=self.inspections,
            numerics=self.numerics,
            distributed=self.distributed,
            hint_list=self.hints,
            table=self.summary,
            wording=self.wording,
        )
        self.out_dir = out
        return self.files

    def _repr_html_(self) -> str:
        e = html.escape
        plans = self.answers()
        parts = ["<div class='precision-nb-profile'><h3>precision_nb profile</h3>"]
        if self.load_note:
            parts.append(f"<p><b>{e(self.load_note)}</b></p>")
        parts.append(cards_html(plans))
        columns = [c for c in NOTEBOOK_COLUMNS if c in self.summary]
        columns += [
            c for c in NOTEBOOK_TRUE_COLUMNS if c in self.summary and self.summary[c].notna().any()
        ]
        parts.append(self.summary[columns].to_html(index=False, float_format=fmt, na_rep=""))
        shown = other_hints(self.hints, plans)
        if shown:
            items = "".join(
                f"<li><b>{e(h.run)}</b>: {e(h.message)} <small>{e(h.source(self.out_dir))}"
                "</small></li>"
                for h in shown
            )
            parts.append(f"<p><b>Hints</b></p><ul>{items}</ul>")
        figs = make_figures(self.comparison, inspections=self.inspections)
        parts.append(img_html("dashboard", figure_to_png(figs["dashboard"])))
        if self.time_split is not None:
            parts.append(f"<h4>{e(TIME_TITLE)}</h4>")
            parts.append(time_split_html(self.time_split, level=5))
        if self.inspections:
            parts.append(inspection_html(self.inspections, level=4, figures=False))
        if self.numerics is not None:
            parts.append(f"<p><b>Numerics</b>: {e(self.numerics.window_text())}</p>")
        if self.distributed:
            parts.append(distributed_html(self.distributed))
        rows = "".join(
            f"<tr><th style='text-align:left'>{e(str(k))}</th><td style='text-align:left'>"
            f"{e(str(v))}</td></tr>"
            for k, v in self.settings.items()
        )
        parts.append(details("Settings and method", f"<table>{rows}</table>") + "</div>")
        return "".join(parts)

    def __repr__(self) -> str:
        lines = [f"Profile of {', '.join(self.comparison.results) or 'no run'}"]
        lines += [f"  {self.load_note}"] if self.load_note else []
        lines += [f"  {v}" for v in self.verdicts.values()]
        if self.time_split is not None:
            lines += [f"  {x}" for x in time_split_lines(self.time_split)]
        if self.out_dir is not None:
            lines.append(f"  saved in {self.out_dir}")
        return "\n".join(lines)


def measurement_settings(comparison: Comparison, hint_list: tuple[Hint, ...]) -> dict[str, Any]:
    """Model, device, torch, CPU/GPU facts, TF32, method; "what to try next" last."""
    results = comparison.results
    out: dict[str, Any] = {}
    model = comparison.model_info
    if model:
        out["model"] = f"{model.get('class')} ({model.get('params', 0):,} parameters)"
    devices = sorted({str(r.device) for r in results.values()} - {""})
    out["device used"] = ", ".join(devices)
    out["torch"] = torch.__version__
    cpu = read_cpu_features()
    out["CPU"] = f"{cpu.cpu_name or 'unknown'}, {torch.get_num_threads()} torch threads"
    out["CPU low-precision features"] = cpu.summary()
    out["CPU vector ISA (torch kernel dispatch; not a BF16 test)"] = cpu.vector_isa
    for result in results.values():
        caps = capabilities_of(result)
        if caps is not None and caps.cuda_available and any(d.startswith("cuda") for d in devices):
            cc = caps.compute_capability
            out["GPU"] = (
                f"{caps.device_name} (compute capability {cc[0]}.{cc[1]})"
                if cc
                else caps.device_name
            )
            break
    for label, outcome in comparison.outcomes.items():
        if outcome.tf32:
            out[f"TF32 state ({label})"] = ", ".join(f"{k}={v}" for k, v in outcome.tf32.items())
    if comparison.peak_ratios:
        kind = "datasheet" if any(d.startswith("cuda") for d in devices) else "measured"
        out[f"{kind} matmul peak vs fp32"] = ", ".join(
            f"{k} {v}" if hasattr(v, "ratio") else f"{k} {times_text(v)}"
            for k, v in comparison.peak_ratios.items()
        )
    out.update(comparison.method)
    out["what to try next"] = " | ".join(what_to_try_next(hint_list))
    return out
