"""Distributed training (DDP, FSDP2) launched by torchrun; see docs/distributed.md.

``fit_distributed`` is loaded on first use so importing this package starts nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["fit_distributed", "DistributedResult", "DistributedError"]

_MODULES = dict(fit_distributed="launcher", DistributedResult="results", DistributedError="results")


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
