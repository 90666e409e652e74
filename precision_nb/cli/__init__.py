"""The command line: ``precision-nb plan``, ``profile`` and ``inspect`` (see ``main``).

``main`` is loaded on first use, so ``python -m precision_nb.cli.main`` runs without a warning.
"""

from __future__ import annotations

from typing import Any

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    if name == "main":
        from precision_nb.cli.main import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
