"""A :class:`Hint` and the small helpers the hint rules share (public: the rules live in
several modules)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from precision_nb.core.capabilities import Capabilities
    from precision_nb.engine.results import RunResult

__all__ = [
    "Hint",
    "capabilities_of",
    "is_mixed",
    "is_number",
    "rate_text",
    "share_text",
    "who",
    "workload_info",
]


#: How the name of a report folder's file ends (a hint's figure that is a file).
_FILE_ENDINGS = (".png", ".csv", ".html", ".json", ".txt")


@dataclass(frozen=True)
class Hint:
    """One observation: which run (or ``"all"``), the topic, the message, the measurement used."""

    run: str
    topic: str
    message: str
    measurement: str
    #: The report figure (or table) the hint rests on, e.g. "throughput.png", "summary table".
    figure: str = "summary table"
    #: What to try next, drawn from this measurement ("" when nothing follows from it).
    next_step: str = ""

    def source(self, report: str | Path | None = None) -> str:
        """``"(from: MEASUREMENT; see FIGURE)"``: a file of the report folder is cited in
        ``report`` (the folder's path) only; without a report folder, no file is cited."""
        if not self.figure.endswith(_FILE_ENDINGS):  # a table, not a file of the folder
            return f"(from: {self.measurement}; see {self.figure})"
        if report is None:
            return f"(from: {self.measurement})"
        return f"(from: {self.measurement}; see {Path(report) / self.figure})"

    def text(self, report: str | Path | None = None) -> str:
        """The hint in one line, citing its file in ``report`` when there is one."""
        return f"[{self.run}] {self.message} {self.source(report)}"

    def __str__(self) -> str:
        return self.text()

    def applies_to(self, label: str) -> bool:
        """True when this hint is about run ``label`` (directly, in a list, or ``"all"``)."""
        return self.run == "all" or label == self.run or label in self.run.split(", ")

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def who(labels: Sequence[str], rows: Mapping[str, Any]) -> str:
    """``"all"`` when a hint is about every run of several, else the runs' labels."""
    return "all" if len(rows) > 1 and len(labels) == len(rows) else ", ".join(labels)


def is_mixed(row: Mapping[str, Any]) -> bool:
    return row.get("mode") in ("bf16", "fp16")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def rate_text(flops_per_s: float) -> str:
    for scale, unit in ((1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.1f} {unit}"
    return f"{flops_per_s:.0f} FLOP/s"


def share_text(fraction: float) -> str:
    """A fraction as a percentage that keeps two significant digits below 1 % (an MFU of 0.026 %
    is not written as 0.0 %)."""
    percent = fraction * 100
    if percent >= 10:
        return f"{percent:.0f}%"
    if percent >= 1:
        return f"{percent:.1f}%"
    return f"{percent:.2g}%"


def workload_info(results: Mapping[str, RunResult]) -> Mapping[str, Any]:
    """The first run's workload description (all runs of a comparison share the workload)."""
    return next((r.workload for r in results.values() if r.workload), {})


def capabilities_of(result: RunResult | None) -> Capabilities | None:
    """The capabilities a run's plan was resolved against (None without a run or explanation)."""
    explanation = result.explanation if result is not None else None
    return explanation.capabilities if explanation is not None else None
