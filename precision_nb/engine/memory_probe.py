"""Memory of the training device, read only when asked (log time): :class:`MemoryProbe` reads the
CUDA allocator, MPS or this process's resident set (:func:`host_rss`, cheap enough to read once
per logging interval).
"""

from __future__ import annotations

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


_PROCESS: psutil.Process | None = None


def _this_process() -> psutil.Process:
    """This process, looked up once (building a ``psutil.Process`` costs ~0.2 ms per fit)."""
    global _PROCESS
    if _PROCESS is None or _PROCESS.pid != os.getpid():  # a forked child gets its own
        _PROCESS = psutil.Process()
    return _PROCESS


_STATM: tuple[int, int] | None = None  # (pid, open fd of that process's /proc/<pid>/statm)
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0


def _statm_fd() -> int | None:
    """An fd of this process's ``/proc/<pid>/statm``, opened once per process (None off Linux)."""
    global _STATM
    pid = os.getpid()
    if _STATM is None or _STATM[0] != pid:  # a forked child opens its own
        try:
            _STATM = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY))
        except OSError:
            _STATM = (pid, -1)
    return _STATM[1] if _STATM[1] >= 0 else None


def host_rss() -> int:
    """This process's resident set size in bytes, read once per logging interval.

    On Linux from ``/proc/<pid>/statm`` through an fd kept open (the resident pages times the page
    size, the number ``psutil`` reports, at about a tenth of its cost per read); elsewhere from
    ``psutil``."""
    fd = _statm_fd()
    if fd is not None and _PAGE_SIZE:
        return int(os.pread(fd, 128, 0).split()[1]) * _PAGE_SIZE
    return int(_this_process().memory_info().rss)


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
        if self.device.type == "mps":
            current = int(torch.mps.current_allocated_memory())
        else:
            current = host_rss()
        self._peak = max(self._peak, current)
        return MemoryReading(self.kind, current, self._peak, None)
