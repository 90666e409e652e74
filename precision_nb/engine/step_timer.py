"""Wall time of every optimizer attempt, without a host sync inside the loop.

- CPU: the host clock at the attempt's start and end (the work is synchronous).
- MPS: the host clock; the last attempt before a logging point waits for the device
  (``torch.mps.synchronize()``) before its end time, so queued work lands in an attempt.
- CUDA: a pair of CUDA events recorded around each attempt, read at the logging point, after the
  logging transfer has synchronised (``Event.elapsed_time`` then waits for nothing).

Logging work between attempts is inside no attempt's time.

A profiler can see where each attempt begins and ends: set :attr:`StepTimer.marker` to a factory of
context managers (``lambda: torch.profiler.record_function("...")``); each attempt then runs inside
one. The timed rounds leave it None.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class StepTimer:
    """``start()`` / ``stop()`` around each attempt; ``collect()`` at a logging point."""

    def __init__(self, device: torch.device) -> None:
        self.kind = torch.device(device).type
        self._open: Any = None
        self._pairs: list[tuple[Any, Any]] = []
        #: None, or a factory of context managers entered around each attempt (a profiler mark)
        self.marker: Any = None
        self._mark: Any = None

    def start(self) -> None:
        if self.marker is not None:
            self._mark = self.marker()
            self._mark.__enter__()
        if self.kind == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._open = event
        else:
            self._open = time.perf_counter()

    def stop(self, last: bool = False) -> None:
        """End the open attempt; ``last``: a logging point follows (MPS waits for the device)."""
        if self._open is None:
            return
        if self.kind == "cuda":
            end: Any = torch.cuda.Event(enable_timing=True)
            end.record()
        else:
            if last and self.kind == "mps":
                torch.mps.synchronize()
            end = time.perf_counter()
        self._pairs.append((self._open, end))
        self._open = None
        if self._mark is not None:
            mark, self._mark = self._mark, None
            mark.__exit__(None, None, None)

    def collect(self) -> list[float]:
        """Seconds of each finished attempt since the last collect (an unfinished one is dropped).

        On CUDA call it after the logging transfer: the events are complete by then.
        """
        pairs, self._pairs, self._open = self._pairs, [], None
        if self.kind == "cuda":
            if pairs:
                pairs[-1][1].synchronize()  # complete already after the transfer: no wait
            return [start.elapsed_time(end) / 1e3 for start, end in pairs]
        return [end - start for start, end in pairs]
