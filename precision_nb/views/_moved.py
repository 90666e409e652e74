"""Forwarders that keep the old module paths of moved view modules working, with a warning."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def forwarder(old: str, new: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old`` that forwards every name to ``new`` (deprecated)."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        warnings.warn(
            f"{old} moved to {new}; import {name} from there (the old path will be removed)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__
