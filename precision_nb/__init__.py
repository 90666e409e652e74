"""precision_nb: PyTorch mixed precision you can see.

The public names below are loaded on first use, so ``import precision_nb`` stays light: it never
imports matplotlib, ipywidgets, pandas or jupyter (the views load those when they are asked for).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # core
    "PrecisionPlan": "precision_nb.core.plan",
    "PrecisionConfig": "precision_nb.core.plan",
    "Capabilities": "precision_nb.core.capabilities",
    "PRESETS": "precision_nb.core.capabilities",
    "read_capabilities": "precision_nb.core.capabilities",
    "get_capabilities": "precision_nb.core.capabilities",
    "resolve_device": "precision_nb.core.device",
    "resolve_precision": "precision_nb.core.resolution",
    "explain_precision": "precision_nb.core.resolution",
    "plan": "precision_nb.core.resolution",
    "Explanation": "precision_nb.core.resolution",
    "MATRIX": "precision_nb.core.resolution",
    "autocast_context": "precision_nb.core.amp",
    "make_grad_scaler": "precision_nb.core.amp",
    "verify_autocast": "precision_nb.core.amp",
    "AutocastCheck": "precision_nb.core.amp",
    "OptimizerConfig": "precision_nb.core.optim",
    "FusedOutcome": "precision_nb.core.optim",
    "supports_fused_adamw": "precision_nb.core.optim",
    "build_optimizer": "precision_nb.core.optim",
    "RunConfig": "precision_nb.core.config",
    "load_config": "precision_nb.core.config",
    "Distributed": "precision_nb.core.distributed",
    "explain_distributed": "precision_nb.core.distributed",
    "CLUSTER_PRESETS": "precision_nb.core.distributed",
    "expected_comm_bytes": "precision_nb.core.distributed",
    "ring_seconds": "precision_nb.core.distributed",
    # engine
    "Trainer": "precision_nb.engine.trainer",
    "TrainConfig": "precision_nb.engine.train_config",
    "RunResult": "precision_nb.engine.results",
    "RunRequest": "precision_nb.engine.request",
    "fit": "precision_nb.engine.entry",
    "FitSession": "precision_nb.engine.session",
    "Precision": "precision_nb.engine.precision",
    "Callback": "precision_nb.engine.callbacks",
    "FitError": "precision_nb.engine.results",
    "LossScaleFloorError": "precision_nb.engine.results",
    "get_workload": "precision_nb.engine.workloads",
    "WORKLOADS": "precision_nb.engine.workloads",
    "compare": "precision_nb.engine.compare",
    "time_adamw": "precision_nb.engine.adamw_timing",
    "AdamWTiming": "precision_nb.engine.adamw_timing",
    "Comparison": "precision_nb.engine.compare",
    "MeasureConfig": "precision_nb.engine.measure",
    "fit_distributed": "precision_nb.engine.distributed.launcher",
    "DistributedError": "precision_nb.engine.distributed.results",
    "write_spec": "precision_nb.engine.distributed.launcher",
    "node_commands": "precision_nb.engine.distributed.nodes",
    "gather": "precision_nb.engine.distributed.gather",
    "autocast_policy": "precision_nb.engine.inspect.policy",
    # views (loaded only when asked for: they import matplotlib, pandas, ipywidgets)
    "Panel": "precision_nb.views.panel.api",
    "to_frame": "precision_nb.views.report.tables",
    "summary": "precision_nb.views.report.tables",
    "hints": "precision_nb.views.report.hints",
    "dashboard_figure": "precision_nb.views.report.figures",
    "profile": "precision_nb.views.report.profile",
    "Profile": "precision_nb.views.report.profile_result",
    "inspect": "precision_nb.views.report.inspection",
    "Inspection": "precision_nb.views.report.inspection",
    "numerics": "precision_nb.views.report.numerics",
    "Numerics": "precision_nb.views.report.numerics",
    "gather_report": "precision_nb.views.report.gather",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'precision_nb' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
