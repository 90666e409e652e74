"""The ipywidgets panel: ``Panel`` and the pieces it is built from (see docs/panel.md).

``api`` (``Panel``: the user's verbs and read-only state), ``builder`` (its arguments checked,
its parts made, laid out and wired), ``controller`` (what its buttons, controls and tabs do),
``layout`` (the header, the tabs and ``panel.widgets``), ``selection`` (the controls' values and
their checks), ``controls`` (input widgets), ``plan_resolver`` (the cached plan of a selection
and the live plan shown), ``outputs`` (output widgets), ``session`` (background runs, the
plotting budget, what is drawn after a run), ``run`` (the worker thread and the throttled engine
callback), ``results`` (the Compare tab, verdict first), ``analysis`` and ``analysis_html`` (the
Memory, Ops and Numerics tabs), ``code`` (the code a plan corresponds to), ``live_charts`` (SVG
charts during a run), ``distributed`` (the Distributed tab) and ``distributed_run`` (a
distributed run and its per-rank view).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Panel":
        from precision_nb.views.panel.api import Panel

        return Panel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
