"""Distributed training (DDP, FSDP2) launched by torchrun; see docs/distributed.md.

``fit_distributed`` is loaded on first use so importing this package starts nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fit_distributed", "DistributedResult", "DistributedError"]


def __getattr__(name: str) -> Any:
    if name == "fit_distributed":
        from precision_nb.engine.distributed.launcher import fit_distributed

        return fit_distributed
    if name in ("DistributedResult", "DistributedError"):
        from precision_nb.engine.distributed import results

        return getattr(results, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
