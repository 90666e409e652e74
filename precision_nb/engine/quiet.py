"""Torch's noise kept out of the user's output: :func:`captured` sends what a block of code warns
or logs (also through handlers that hold the real stderr, such as torch's own) and, optionally,
prints into a list of notes that the caller keeps and shows where it belongs;
:func:`profiler_ranges_unsaid` drops one dynamo log line only, the one that says it leaves a
profiler range (the optimizer step's own, a profiled step's mark) out of the graph it traces.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout

__all__ = ["PROFILER_RANGE", "captured", "profiler_ranges_unsaid"]

#: Dynamo's words when it traces past a profiler range (``torch.autograd.profiler.
#: record_function``): the range is left out of the graph; nothing the toolkit measures changes.
PROFILER_RANGE = re.compile(r"Profiler (record )?function .* will be ignored")
#: The loggers dynamo says it through.
_DYNAMO_LOGGERS = ("torch._dynamo.variables.torch", "torch._dynamo.variables.ctx_manager")


class _Divert(logging.Filter):
    """Keeps a log record's text and stops the handler it is attached to from writing it."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(f"{record.name}: {record.getMessage()}")
        return False


@contextlib.contextmanager
def captured(notes: list[str], *, printed: bool = True) -> Iterator[None]:
    """Warnings and log records of the block go into ``notes`` instead of the user's output;
    with ``printed``, also what it writes to ``sys.stdout`` / ``sys.stderr``."""
    divert = _Divert()
    handlers = {id(h): h for h in logging.getLogger().handlers}
    for name in list(logging.root.manager.loggerDict):
        handlers.update({id(h): h for h in getattr(logging.getLogger(name), "handlers", [])})
    # records that would reach no handler (Python's last resort); the filter stops every record,
    # so this handler never emits
    keep = logging.Handler(logging.DEBUG)
    keep.addFilter(divert)
    logging.getLogger().addHandler(keep)
    for h in handlers.values():
        h.addFilter(divert)
    text = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.ExitStack() as stack:
            warnings.simplefilter("always")
            if printed:
                stack.enter_context(redirect_stderr(text))
                stack.enter_context(redirect_stdout(text))
            yield
    finally:
        logging.getLogger().removeHandler(keep)
        for h in handlers.values():
            h.removeFilter(divert)
        notes += [f"{w.category.__name__}: {w.message}" for w in caught] + divert.records
        notes += [line for line in text.getvalue().splitlines() if line.strip()]


def _not_profiler_range(record: logging.LogRecord) -> bool:
    """A log filter: False for dynamo's :data:`PROFILER_RANGE` line."""
    return not PROFILER_RANGE.match(record.getMessage())


@contextlib.contextmanager
def profiler_ranges_unsaid() -> Iterator[None]:
    """Within the block, dynamo's :data:`PROFILER_RANGE` line is dropped; every other warning
    and log line of dynamo reaches the user as before."""
    loggers = [logging.getLogger(name) for name in _DYNAMO_LOGGERS]
    for logger in loggers:
        logger.addFilter(_not_profiler_range)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(_not_profiler_range)
