"""What torch records about its own compilations, read in one place.

TorchDynamo keeps one ``CompilationMetrics`` entry per compilation (``torch._dynamo.utils.
get_compilation_metrics()``: a forward frame, or the backward AOTAutograd compiles at the first
backward) with its duration, the guard failure that caused a recompilation, the local FX-graph and
AOTAutograd cache hits and misses, the graph breaks and any failure. Inductor counts every graph
it compiled without the CUDA graphs its mode asked for (``counters["inductor"]["cudagraph_skips"]``)
and, on a CUDA device, logs why on the ``cudagraphs`` artifact logger (off CUDA it counts the skip
and logs nothing). These are private structures of torch; this module is the only one that reads
them, and a test pins their layout against the installed torch.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["CUDAGRAPH_LOGGER", "TorchCompilation", "TorchCompilations", "TorchWatch"]

#: The artifact logger inductor reports CUDA-graph skips on (its messages never propagate to the
#: root logger unless TORCH_LOGS asks for them; a handler attached here still receives them).
CUDAGRAPH_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"


@dataclass(frozen=True)
class TorchCompilation:
    """One compilation as torch recorded it.

    ``kind``: "forward" (a frame dynamo compiled) or "backward" (AOTAutograd's backward graph).
    ``seconds``: its duration. ``recompile_reason``: the guard that failed (None for a first
    compile). ``cache_hits`` / ``cache_misses``: local FX-graph plus AOTAutograd cache lookups.
    """

    compile_id: str
    kind: str
    seconds: float
    recompile_reason: str | None = None
    graph_breaks: int = 0
    cache_hits: int = 0
    cache_misses: int = 0


@dataclass(frozen=True)
class TorchCompilations:
    """The compilations and CUDA-graph skips seen inside one :class:`TorchWatch`."""

    entries: tuple[TorchCompilation, ...] = ()
    cudagraph_skips: tuple[str, ...] = ()
    #: Graphs inductor compiled without the CUDA graphs the mode asked for (its own counter).
    cudagraph_skip_count: int = 0

    @property
    def seconds(self) -> float:
        """Seconds torch spent compiling (forward frames and backward graphs)."""
        return sum(e.seconds for e in self.entries)

    @property
    def cache(self) -> str:
        """ "hit" (every lookup hit), "miss" (none did), "partial", or "none" (no lookup)."""
        hits = sum(e.cache_hits for e in self.entries)
        misses = sum(e.cache_misses for e in self.entries)
        if hits == 0 and misses == 0:
            return "none"
        if misses == 0:
            return "hit"
        return "miss" if hits == 0 else "partial"


def _metrics_module() -> Any:
    return importlib.import_module("torch._dynamo.utils")


def _cudagraph_skip_count() -> int:
    return int(_metrics_module().counters["inductor"]["cudagraph_skips"])


def _entry(metrics: Any) -> TorchCompilation:
    backward = "backward" if metrics.backward_cumulative_compile_time_us else "other"
    hits = (metrics.inductor_fx_local_cache_hit_count or 0) + (
        metrics.aotautograd_local_cache_hit_count or 0
    )
    misses = (metrics.inductor_fx_local_cache_miss_count or 0) + (
        metrics.aotautograd_local_cache_miss_count or 0
    )
    return TorchCompilation(
        compile_id=str(metrics.compile_id or ""),
        kind="forward" if metrics.is_forward else backward,
        seconds=(metrics.duration_us or 0) / 1e6,
        recompile_reason=metrics.recompile_reason or None,
        graph_breaks=int(metrics.num_graph_breaks or 0),
        cache_hits=int(hits),
        cache_misses=int(misses),
    )


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class TorchWatch:
    """Collect what torch records about compilations made inside the ``with`` block (entries that
    started in it, the CUDA-graph skips counted and the skip messages logged in it).

    ``with TorchWatch() as watch: ...`` then ``watch.result`` (a :class:`TorchCompilations`).
    Entries are told apart by their start time, so compilations before the block (or in other
    watches) are never counted here.
    """

    def __init__(self) -> None:
        self.result = TorchCompilations()
        self._start_us = 0
        self._skips = 0
        self._handler = _Collect()
        self._logger = logging.getLogger(CUDAGRAPH_LOGGER)

    def __enter__(self) -> TorchWatch:
        self._start_us = int(time.time() * 1e6)
        self._skips = _cudagraph_skip_count()
        self._logger.addHandler(self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self._handler)
        self.result = self.read()

    def read(self) -> TorchCompilations:
        """What torch recorded since the block started (callable inside the block too)."""
        entries = [
            _entry(m)
            for m in _metrics_module().get_compilation_metrics()
            if (m.start_time_us or 0) >= self._start_us
        ]
        skips = _cudagraph_skip_count() - self._skips
        return TorchCompilations(tuple(entries), tuple(self._handler.messages), skips)
