"""Reports: records as tables, matplotlib figures, hints, ``report.html`` and ``profile()``.

``tables`` (records -> DataFrame, ``summary()``), ``figures`` (matplotlib Figures), ``hints``
(explanations drawn from the measurements), ``answer`` (one card per plan, verdict first),
``html`` (the report's sections and folder) and ``profile`` (what ``precision-nb profile``
runs). Names are loaded on first use, so importing this package imports no plotting library.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "FIGURES": "html",
    "OUTPUT_FILES": "html",
    "make_figures": "html",
    "render_html": "html",
    "report_files": "html",
    "report_sections": "html",
    "write_report": "html",
    "profile": "profile",
    "profile_request": "profile",
    "run_profile": "profile",
}


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
