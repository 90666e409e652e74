"""The profiled steps' host events as a tree, read straight from the profiler's result.

``torch.profiler.profile.events()`` builds a ``FunctionEvent`` for every recorded event, asking
each for some 35 fields (memory, flops, stack, flow ids) that the split never reads: on the 24
profiled steps of GPT-2 from a small config (54,000 events) it took 4.1 s, where this reader
takes 0.75 s. A trace without device activity (the CPU view) is read here instead: per event
only what the split reads (name, thread, time range, sequence number; input shapes and dtypes
when asked), with the tree built by the same rules ``torch.autograd.profiler_util.EventList``
uses (an event inside another's time range on its thread is its child; a parent whose only child
has its name takes that child's place), so the families come out the same, which a test checks
against ``events()`` on real traces. A trace with device kernels keeps ``events()``: the kernels
are joined to their ops there.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch

__all__ = ["TraceEvent", "host_events"]

#: The names torch leaves out of its event list (``profiler_util._filter_name``).
_LEFT_OUT = frozenset(
    (
        "[memory]",
        "[OutOfMemory]",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    )
)


class TimeRange:
    """An event's start and end in microseconds from the trace's start."""

    __slots__ = ("end", "start")

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end


class TraceEvent:
    """One host event with the fields of ``FunctionEvent`` the split reads."""

    __slots__ = (
        "_dtypes", "_raw", "_shapes", "cpu_children", "cpu_parent", "is_async", "kernels", "name",
        "sequence_nr", "thread", "time_range",
    )  # fmt: skip

    def __init__(self, event: Any, trace_start_ns: int) -> None:
        self.name = _demangle(event.name())
        self.thread = event.start_thread_id()
        start, end = event.start_ns() - trace_start_ns, event.end_ns() - trace_start_ns
        self.time_range = TimeRange(start / 1000, end / 1000)
        self._raw = event
        self.sequence_nr = event.sequence_nr()
        self.is_async = event.is_async() or event.start_thread_id() != event.end_thread_id()
        self.cpu_children: list[TraceEvent] = []
        self.cpu_parent: TraceEvent | None = None
        self.kernels: tuple[Any, ...] = ()
        self._shapes: list[Any] | None = None
        self._dtypes: list[str] | None = None

    @property
    def input_shapes(self) -> list[list[int]]:
        """Read when asked: the first read of an event's shapes costs about 20 us, and the split
        reads them for matmuls and copies only. Set: shapes recorded elsewhere
        (:mod:`~precision_nb.engine.time_split.shapes`)."""
        return self._raw.shapes() if self._shapes is None else self._shapes

    @input_shapes.setter
    def input_shapes(self, shapes: list[Any]) -> None:
        self._shapes = shapes

    @property
    def input_dtypes(self) -> list[str]:
        return self._raw.dtypes() if self._dtypes is None else self._dtypes

    @input_dtypes.setter
    def input_dtypes(self, dtypes: list[str]) -> None:
        self._dtypes = dtypes

    @property
    def cpu_time_total(self) -> float:
        return self.time_range.end - self.time_range.start

    @property
    def self_cpu_time_total(self) -> float:
        if self.is_async:  # outside the tree, as torch counts it
            return 0.0
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)


@functools.lru_cache(maxsize=4096)
def _demangle(name: str) -> str:
    """The name as ``events()`` gives it (demangled; a schedule's ``ProfilerStep#N`` as
    ``ProfilerStep*``)."""
    name = torch._C._demangle(name)
    return "ProfilerStep*" if name.startswith("ProfilerStep#") else name


def host_events(prof: Any) -> list[TraceEvent] | None:
    """The host events of a stopped ``torch.profiler.profile`` without device activity, as a
    tree (sorted by start, longest first); None when its result cannot be read this way (the
    caller then asks ``prof.events()``)."""
    result = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if result is None:
        return None
    start_ns = result.trace_start_ns()
    cpu = torch.autograd.DeviceType.CPU
    events = []
    for raw in result.events():
        if raw.device_type() != cpu:
            return None  # device activity: its kernels are joined to their ops by events()
        if raw.name() in _LEFT_OUT or getattr(raw, "is_hidden_event", lambda: False)():
            continue
        events.append(TraceEvent(raw, start_ns))
    events.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
    _nest(events)
    return _without_repeats(events)


def _nest(events: list[TraceEvent]) -> None:
    """Each event's parent: the innermost event on its thread whose range holds it (an async
    range, which starts and ends on different threads, is in no tree)."""
    # a stable sort: the start order is kept within each thread
    by_thread = sorted((e for e in events if not e.is_async), key=lambda e: e.thread)
    for _, group in itertools.groupby(by_thread, key=lambda e: e.thread):
        open_: list[TraceEvent] = []
        for event in group:
            while open_:
                parent = open_[-1]
                if (
                    event.time_range.start >= parent.time_range.end
                    or event.time_range.end > parent.time_range.end
                ):
                    open_.pop()
                else:
                    parent.cpu_children.append(event)
                    event.cpu_parent = parent
                    break
            open_.append(event)


def _without_repeats(events: list[TraceEvent]) -> list[TraceEvent]:
    """A parent whose only child has its name takes the child's children (and the child goes)."""
    while True:
        gone = set()
        for i, event in enumerate(events):
            parent = event.cpu_parent
            if parent is not None and parent.name == event.name and len(parent.cpu_children) == 1:
                parent.cpu_children = event.cpu_children
                for child in event.cpu_children:
                    child.cpu_parent = parent
                gone.add(i)
        if not gone:
            return events
        events = [e for i, e in enumerate(events) if i not in gone]
