"""The panel's layout: a compact header above tabs, and the typed index of its widgets.

The header holds what every tab needs: the device badge with the request and the plan it
resolves to (one line), Run / Compare / Stop with the progress (one line), the error box and
why Run is disabled. The
tabs: **Plan** (the controls, the explanation with its matrix, copy as code), **Live** (live
numbers and charts, the status line, the events, the matplotlib figure), **Compare** (verdict
first, then the table), **Memory**, **Ops**, **Numerics** (one instrumented step each) and
**Distributed** (the torchrun controls and the per-rank view).

:func:`build_layout` arranges widgets the parts already made; :class:`PanelWidgets` names every
one of them (``panel.widgets.run_button``) with its type. Nothing here decides what a widget
shows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import ipywidgets as widgets

from precision_nb.views.panel.analysis import AnalysisViews
from precision_nb.views.panel.controls import Controls
from precision_nb.views.panel.distributed import DistributedControls
from precision_nb.views.panel.distributed_run import DistributedView
from precision_nb.views.panel.outputs import PanelOutputs

__all__ = [
    "ANALYSIS_TABS",
    "PANEL_STYLE",
    "TABS",
    "PanelWidgets",
    "build_layout",
    "select_tab",
    "tab_name",
]

#: The tabs, in order (``panel.widgets.tabs``).
TABS = ("Plan", "Live", "Compare", "Memory", "Ops", "Numerics", "Distributed")
#: The tabs whose opening inspects the selected plan when their view is stale.
ANALYSIS_TABS = ("Memory", "Ops", "Numerics")

# Scoped to the panel's root: tables scroll inside their tab instead of squeezing their columns,
# and the tabs' labels stay on one line.
PANEL_STYLE = """<style>
.pnb-panel .jupyter-widget-html,.pnb-panel .widget-html{min-width:0}
.pnb-panel .jupyter-widget-html-content,.pnb-panel .widget-html-content{min-width:0;
  line-height:1.45}
.pnb-panel .pnb-table-wrap{overflow-x:auto;max-width:100%}
.pnb-panel table.pnb-table{border-collapse:collapse;font-size:12px;margin:4px 0}
.pnb-panel table.pnb-table th,.pnb-panel table.pnb-table td{padding:2px 8px;
  border-bottom:1px solid #ddd;white-space:nowrap;text-align:right}
.pnb-panel table.pnb-table th{background:#f4f4f4;font-weight:600;white-space:normal;
  vertical-align:bottom}
.pnb-panel table.pnb-table th:first-child,.pnb-panel table.pnb-table td:first-child{
  text-align:left}
.pnb-panel table.pnb-table td.pnb-text{white-space:normal;text-align:left;min-width:12em}
.pnb-panel table.pnb-table th.pnb-text{text-align:left}
.pnb-panel .pnb-charts{display:grid;gap:6px;
  grid-template-columns:repeat(auto-fit,minmax(200px,1fr))}
.pnb-panel .pnb-charts svg{width:100%;height:auto}
.pnb-panel .pnb-header{border-bottom:1px solid #ccc;padding-bottom:4px;margin-bottom:4px}
.pnb-panel .pnb-progress-label{display:block;overflow:hidden;text-overflow:ellipsis;
  white-space:nowrap}
</style>"""


def tab_name(index: int | None) -> str | None:
    """The name of tab ``index`` (None: no tab selected)."""
    return None if index is None else TABS[index]


def select_tab(tabs: widgets.Tab, name: str) -> None:
    """Show tab ``name`` (a plain value assignment: safe from the run's worker thread)."""
    tabs.selected_index = TABS.index(name)


@dataclass(frozen=True)
class PanelWidgets:
    """Every widget of a panel, by name (``panel.widgets.<name>``).

    The stable CSS class of each (``pnb-...``, docs/panel.md) is what browser tests use; these
    names are what code and headless tests use. Reading a value is safe; setting one acts as the
    user would (a control's observers run, a button's ``click()`` fires its handler).
    """

    # the root and its tabs
    root: widgets.VBox
    tabs: widgets.Tab
    # header
    badge: widgets.HTML
    headline: widgets.HTML
    run_button: widgets.Button
    compare_button: widgets.Button
    stop_button: widgets.Button
    progress: widgets.IntProgress
    progress_label: widgets.Label
    run_reason: widgets.HTML
    error_box: widgets.HTML
    # Plan
    device: widgets.Dropdown
    device_text: widgets.Text
    mode: widgets.ToggleButtons
    dtype: widgets.Dropdown
    fused: widgets.ToggleButtons
    compile: widgets.Dropdown
    loss_scale_lab: widgets.Checkbox
    lab_note: widgets.HTML
    workload: widgets.Dropdown
    preset: widgets.Dropdown
    steps: widgets.BoundedIntText
    accumulation: widgets.BoundedIntText
    seed: widgets.IntText
    compare_plans: widgets.SelectMultiple
    budget: widgets.BoundedFloatText
    plan_html: widgets.HTML
    code_title: widgets.HTML
    code_framework: widgets.Dropdown
    code_area: widgets.Textarea
    # Live
    live_metrics: widgets.HTML
    live_charts: widgets.HTML
    status: widgets.HTML
    events_html: widgets.HTML
    figure_button: widgets.Button
    figure_note: widgets.HTML
    figure_image: widgets.Image
    # Compare
    results_html: widgets.HTML
    # Memory, Ops, Numerics
    inspect_button: widgets.Button
    analysis_note: widgets.HTML
    memory_html: widgets.HTML
    ops_html: widgets.HTML
    numerics_html: widgets.HTML
    numerics_formats: widgets.Text
    # Distributed
    strategy: widgets.ToggleButtons
    nproc: widgets.IntText
    backend: widgets.Dropdown
    comm_hook: widgets.Dropdown
    param_dtype: widgets.Dropdown
    reduce_dtype: widgets.Dropdown
    output_dtype: widgets.Dropdown
    dist_note: widgets.HTML
    rank_html: widgets.HTML


def build_layout(
    controls: Controls,
    dist: DistributedControls,
    outputs: PanelOutputs,
    analysis: AnalysisViews,
    per_rank: DistributedView,
) -> PanelWidgets:
    """Arrange the parts' widgets into the header and the tabs; returns every widget by name."""
    o, a = outputs, analysis
    title = widgets.HTML("<b style='font-size:1.1em'>precision_nb</b>")
    row = widgets.Layout(flex_flow="row wrap", align_items="center", width="100%")
    line = widgets.HBox([title, o.badge, o.headline], layout=row)
    buttons = [o.run_button, o.compare_button, o.stop_button, o.progress, o.progress_label]
    toolbar = widgets.HBox(buttons, layout=row)
    header = widgets.VBox([widgets.HTML(PANEL_STYLE), line, toolbar, o.error_box, o.run_reason])
    header.add_class("pnb-header")

    pages = {
        "Plan": [
            controls.box(),
            o.plan_html,
            widgets.HBox([o.code_title, o.code_framework]),
            o.code_area,
        ],
        "Live": [
            o.live_metrics,
            o.live_charts,
            o.status,
            o.events_html,
            widgets.HBox([o.figure_button, o.figure_note], layout=widgets.Layout(width="100%")),
            o.figure_image,
        ],
        "Compare": [o.results_html],
        "Memory": [widgets.HBox([a.button, a.note]), a.memory_html],
        "Ops": [a.ops_html],
        "Numerics": [a.formats, a.numerics_html],
        "Distributed": [dist.box, per_rank.box],
    }
    tabs = widgets.Tab(
        children=[widgets.VBox(pages[name], layout=widgets.Layout(width="100%")) for name in TABS],
        titles=list(TABS),
        selected_index=0,
    )
    tabs.add_class("pnb-tabs")
    root = widgets.VBox([header, tabs], layout=widgets.Layout(width="100%"))
    root.add_class("pnb-panel")
    # every other widget has its field's name in the part that made it
    named = {
        "root": root,
        "tabs": tabs,
        "inspect_button": a.button,
        "analysis_note": a.note,
        "numerics_formats": a.formats,
        "dist_note": dist.note,
        "rank_html": per_rank.html,
    }
    for field in dataclasses.fields(PanelWidgets):
        if field.name not in named:
            part = next(p for p in (o, controls, dist, a) if hasattr(p, field.name))
            named[field.name] = getattr(part, field.name)
    return PanelWidgets(**named)
