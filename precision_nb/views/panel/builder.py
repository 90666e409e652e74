"""How a panel is put together: its arguments checked, its parts made, laid out and wired.

:func:`build_panel` checks what ``Panel(...)`` is given beyond the controls' values (your model
and batches, the optimizer, logging, train options, the plotting budget), raising ``ValueError``
that names the argument, then makes the parts (controls, plan resolver and live plan, outputs,
run session, analysis views, the Distributed tab), lays them out
(:func:`~.layout.build_layout`), connects every widget event to a
:class:`~.controller.PanelController`, sets the controls' first values and resolves the plan
once. Nothing else in the panel wires widgets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from precision_nb.core.capabilities import read_capabilities
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.validate import positive_int, short_repr
from precision_nb.engine.analyses import ModelSource
from precision_nb.views.panel.analysis import AnalysisViews, selected_target
from precision_nb.views.panel.controller import PanelController
from precision_nb.views.panel.controls import Controls
from precision_nb.views.panel.distributed import DistributedControls, DistributedPlanner
from precision_nb.views.panel.distributed_run import user_inputs
from precision_nb.views.panel.layout import build_layout
from precision_nb.views.panel.outputs import PanelOutputs
from precision_nb.views.panel.plan_resolver import LivePlan, PlanResolver, device_options
from precision_nb.views.panel.run import check_train_options
from precision_nb.views.panel.session import RunSession, UserModel

__all__ = ["build_panel"]


def _model_source(session: RunSession, controls: Controls) -> ModelSource:
    """The model (or workload name), batches, loss_fn and preset the analysis views inspect."""
    user = session.user_model
    if user is not None:
        return ModelSource(user.model, user.batches, user.loss_fn)
    selection = controls.selection()
    return ModelSource(selection.workload, preset=selection.preset or "tiny")


def _show_scale_window(outputs: PanelOutputs, session: RunSession, window: tuple[int, int]) -> None:
    """A numerics analysis found the safe fp16 window: shade it on the finished run's chart."""
    outputs.scale_window = window
    if not session.running and session.source is not None:
        from precision_nb.views.report.tables import to_frame

        outputs.live_charts.value = outputs.charts(to_frame(session.source).to_dict("records"))


def build_panel(
    initial: Mapping[str, Any],
    distributed: Any,
    model: Any,
    batches: Any,
    *,
    loss_fn: Any,
    factory: str | None,
    workload: str | None,
    preset: str | None,
    optimizer: OptimizerConfig | None,
    log_every: int | None,
    train_options: dict[str, Any] | None,
    plot_budget: float,
    refresh_interval_s: float,
) -> PanelController:
    """Check ``Panel(...)``'s arguments (see :class:`~.api.Panel`; ``ValueError`` names the bad
    one, its value and what is allowed), then make the parts of a panel, laid out and wired, its
    controls set to ``initial`` (control name -> value, checked as ``Panel.set`` checks them) and
    ``distributed``, the plan resolved."""
    if (model is None) != (batches is None):
        missing = "batches" if batches is None else "model"
        raise ValueError(
            f"{missing} is None; pass model and batches together (your own nn.Module and "
            "its batches), or neither to use a built-in workload"
        )
    if optimizer is not None and not isinstance(optimizer, OptimizerConfig):
        raise ValueError(
            f"optimizer={short_repr(optimizer)} must be an OptimizerConfig (or None for the "
            "defaults)"
        )
    if log_every is not None:
        positive_int("log_every", log_every)
    is_number = isinstance(plot_budget, (int, float)) and not isinstance(plot_budget, bool)
    if not (is_number and 0 < plot_budget < 1):
        raise ValueError(
            f"plot_budget={short_repr(plot_budget)} must be a fraction between 0 and 1"
        )
    if model is not None and (workload is not None or preset is not None):
        raise ValueError(
            "workload/preset cannot be set together with model=...; the panel trains your "
            "model on your batches"
        )
    checked = check_train_options(train_options)
    if factory is not None and (model is None or not isinstance(factory, str)):
        raise ValueError(
            f"factory={short_repr(factory)}: allowed: None, or with model=... an import path "
            "'package.module:function' returning the model for torchrun's workers"
        )
    user = None
    if model is not None:
        batches, batches_path, loss_fn, loss_path = user_inputs(batches, loss_fn)
        user = UserModel(model, batches, loss_fn, factory, batches_path, loss_path)
    capabilities = read_capabilities()
    resolver = PlanResolver(capabilities, optimizer or OptimizerConfig())
    from precision_nb.engine.workloads import PRESETS, WORKLOADS

    workloads = {} if user is not None else {name: tuple(PRESETS) for name in WORKLOADS}
    controls = Controls(device_options(capabilities), workloads, user_model=user is not None)
    dist = DistributedControls()
    outputs = PanelOutputs()
    session = RunSession(
        outputs,
        user_model=user,
        optimizer_for=resolver.optimizer_for,
        log_every=log_every,
        train_options=checked,
        plot_budget=float(plot_budget),
        refresh_interval_s=refresh_interval_s,
    )
    plan = LivePlan(resolver, controls, outputs, DistributedPlanner(dist, session))
    analysis = AnalysisViews(
        model_source=lambda: _model_source(session, controls),
        selected=lambda: selected_target(plan.explanation, controls.selection()),
        running=lambda: session.running,
        on_window=lambda window: _show_scale_window(outputs, session, window),
    )
    named = build_layout(controls, dist, outputs, analysis, session.per_rank)
    controller = PanelController(
        capabilities, resolver, controls, dist, outputs, plan, session, analysis, named
    )

    session.on_released = lambda _job: controller.update_buttons()
    session.after_run = controller.after_run
    outputs.run_button.on_click(lambda _button: controller.start("run"))
    outputs.compare_button.on_click(lambda _button: controller.start("compare"))
    outputs.stop_button.on_click(lambda _button: controller.stop())
    outputs.figure_button.on_click(controller.on_figure_click)
    analysis.button.on_click(lambda _button: controller.inspect_now())
    analysis.formats.observe(lambda _change: controller.inspect_now(), "value")
    named.tabs.observe(controller.on_tab_change, "selected_index")

    controls.apply(controls.normalise(**initial))
    dist.apply(dist.normalise({"distributed": distributed}))
    controls.observe(controller.on_control_change)
    dist.observe(controller.on_control_change)
    named.code_framework.observe(controller.on_control_change, "value")
    controller.refresh()
    return controller
