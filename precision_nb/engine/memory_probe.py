"""Memory of the training device, read only when asked (log time): :class:`MemoryProbe` reads the
CUDA allocator, MPS or this process's resident set (:func:`host_rss`, cheap enough to read once
per logging interval).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import psutil
import torch

__all__ = ["MemoryProbe", "MemoryReading", "host_rss"]


@dataclass(frozen=True)
class MemoryReading:
    kind: str  # "cuda_allocated" | "mps_allocated" | "host_rss"
    current: int
    peak: int
    reserved: int | None


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0


@functools.lru_cache(maxsize=1)
def _process(pid: int) -> psutil.Process:
    """Process ``pid``, looked up once (building a ``psutil.Process`` costs ~0.2 ms per fit); a
    forked child, with its own pid, gets its own."""
    return psutil.Process(pid)


@functools.lru_cache(maxsize=1)
def _statm_fd(pid: int) -> int | None:
    """An fd of ``/proc/<pid>/statm``, opened once per process (None off Linux)."""
    try:
        return os.open(f"/proc/{pid}/statm", os.O_RDONLY)
    except OSError:
        return None


def host_rss() -> int:
    """This process's resident set size in bytes, read once per logging interval.

    On Linux from ``/proc/<pid>/statm`` through an fd kept open (the resident pages times the page
    size, the number ``psutil`` reports, at about a tenth of its cost per read); elsewhere from
    ``psutil``."""
    fd = _statm_fd(os.getpid())
    if fd is not None and _PAGE_SIZE:
        return int(os.pread(fd, 128, 0).split()[1]) * _PAGE_SIZE
    return int(_process(os.getpid()).memory_info().rss)


class MemoryProbe:
    """Memory of the training device, read only when :meth:`read` is called (at log time)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._peak = 0

    @property
    def kind(self) -> str:
        return {"cuda": "cuda_allocated", "mps": "mps_allocated"}.get(self.device.type, "host_rss")

    def reset(self) -> None:
        """Start a new peak window (CUDA: allocator peak stats; elsewhere: sampled max)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._peak = 0

    def read(self) -> MemoryReading:
        if self.device.type == "cuda":
            return MemoryReading(
                "cuda_allocated",
                int(torch.cuda.memory_allocated(self.device)),
                int(torch.cuda.max_memory_allocated(self.device)),
                int(torch.cuda.max_memory_reserved(self.device)),
            )
        mps = self.device.type == "mps"
        current = int(torch.mps.current_allocated_memory()) if mps else host_rss()
        self._peak = max(self._peak, current)
        return MemoryReading(self.kind, current, self._peak, None)
