"""The panel's readable state: its controls as properties, the resolved plan, the last run's
records, summary and figures (a mixin of :class:`~precision_nb.views.panel.api.Panel`).
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

from precision_nb.core.plan import PrecisionPlan
from precision_nb.core.resolution import Explanation
from precision_nb.views.panel.selection import Selection


def _control_property(name: str) -> property:
    def getter(self: Any) -> Any:
        return getattr(self.selection, name)

    def setter(self: Any, value: Any) -> None:
        self.set(**{name: value})

    doc = f"The {name} control (reading gives the current value; assigning calls set({name}=...))."
    return property(getter, setter, doc=doc)


def _forward(path: str, doc: str) -> property:
    """A read-only property giving ``self.<path>``."""
    return property(operator.attrgetter(path), doc=doc)


class PanelReadout:
    """Read-only views of a panel's state; the panel provides ``controls``, ``outputs``,
    ``session``, ``_plan``, ``_closed`` and ``set()``."""

    device = _control_property("device")
    mode = _control_property("mode")
    dtype = _control_property("dtype")
    fused = _control_property("fused")
    workload = _control_property("workload")
    preset = _control_property("preset")
    steps = _control_property("steps")
    accumulation = _control_property("accumulation")
    seed = _control_property("seed")
    loss_scale_lab = _control_property("loss_scale_lab")
    compare_plans = _control_property("compare_plans")

    @property
    def selection(self) -> Selection:
        """The controls' current values."""
        return self.controls.selection()

    @property
    def explanation(self) -> Explanation | None:
        """The explanation of the current selection (None when it cannot be resolved)."""
        return self._plan.explanation

    @property
    def plan(self) -> PrecisionPlan | None:
        """The resolved plan of the current selection."""
        return None if self._plan.explanation is None else self._plan.explanation.plan

    @property
    def plan_text(self) -> str:
        """The explanation as readable text (what the plan area shows)."""
        return "" if self._plan.explanation is None else str(self._plan.explanation)

    @property
    def simulated(self) -> bool:
        return bool(self._plan.explanation is not None and self._plan.explanation.simulated)

    @property
    def code(self) -> str:
        """The selected plan as code ("copy as code") in :attr:`code_framework`."""
        return self.outputs.code_area.value

    @property
    def code_framework(self) -> str:
        """The framework of :attr:`code`: pytorch, lightning, accelerate or transformers."""
        return str(self.outputs.code_framework.value)

    @code_framework.setter
    def code_framework(self, value: str) -> None:
        from precision_nb.core.plan_code import framework_name

        self.outputs.code_framework.value = framework_name(value)  # the code follows at once

    @property
    def closed(self) -> bool:
        return self._closed

    error = _forward("outputs.error", "The message shown in the panel's error area, if any.")
    running = _forward("session.running", "True while a run or comparison is going.")
    result = _forward(
        "session.source",
        "The last RunResult (Run) or Comparison (Compare); partial after Stop or a failure.",
    )
    last_exception = _forward("session.last_exception", "What the last run raised, or None.")
    last_live = _forward(
        "session.last_live", "The last run's engine callback (frames, seconds spent plotting)."
    )
    last_render_seconds = _forward(
        "session.last_render_seconds", "Seconds spent drawing after the last run."
    )
    refresh_seconds = _forward("_plan.refresh_seconds", "Seconds the last plan refresh took.")

    @property
    def records_frame(self) -> Any:
        """Every record of the last run or comparison as a pandas DataFrame (live while running)."""
        from precision_nb.views.report.tables import to_frame

        session = self.session
        if session.source is None and session.live is not None:
            return to_frame(session.live.snapshot()[0])
        return to_frame(session.source if session.source is not None else [])

    @property
    def results(self) -> Any:
        """Deprecated name of :attr:`records_frame` (easily confused with :attr:`result`)."""
        warnings.warn(
            "Panel.results is renamed Panel.records_frame (Panel.result is the RunResult)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.records_frame

    @property
    def summary(self) -> Any:
        """One row per plan of the last run or comparison (views.report.tables.summary)."""
        from precision_nb.views.report.tables import summary

        return summary(self.session.source if self.session.source is not None else [])

    @property
    def figures(self) -> dict[str, Any]:
        """Fresh matplotlib Figures of the last run: loss, loss_scale, throughput, memory,
        dashboard (empty dict before any run)."""
        source = self.session.source
        if source is None:
            return {}
        from precision_nb.views.report import figures as f

        return {
            "loss": f.loss_figure(source),
            "loss_scale": f.loss_scale_figure(source),
            "throughput": f.throughput_figure(source),
            "memory": f.memory_figure(source),
            "dashboard": f.dashboard_figure(source),
        }

    # ------------------------------------------------------------------ distributed

    @property
    def distributed(self) -> Any:
        """The ``Distributed`` request of the Distributed section (None: strategy "none", or a
        request the library refuses, ``panel.error`` saying why). Assigning calls
        ``set(distributed=...)``."""
        plan = self._plan.distributed
        return None if plan is None else plan.request

    @distributed.setter
    def distributed(self, value: Any) -> None:
        self.set(distributed=value)

    distributed_plan = _forward(
        "_plan.distributed", "The DistributedPlan of the selection (None without a strategy)."
    )
    distributed_result = _forward(
        "session.per_rank.result",
        "The last distributed run's DistributedResult (every rank's records; a failed run's "
        "too), or None.",
    )

    @property
    def rank_tables(self) -> dict[str, Any]:
        """The per-rank view's tables as DataFrames: ``steps`` (step time median and IQR, final
        loss), ``memory`` (bytes by kind and dtype), ``comm`` (bytes per step by op and dtype);
        empty before a distributed run."""
        return self.session.per_rank.tables()
