"""The ipywidgets panel: ``Panel`` and the pieces it is built from (see docs/panel.md).

Which module does what: docs/panel.md, "How it is built" (``api`` is ``Panel``).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Panel":
        from precision_nb.views.panel.api import Panel

        return Panel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
