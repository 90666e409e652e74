"""Torch's noise kept out of the user's output and recorded: :func:`captured` sends what a block
of code warns or logs (also through handlers that hold the real stderr, such as torch's own)
and, optionally, prints into a list of notes that the caller keeps and shows where it belongs.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout

__all__ = ["captured"]


class _Divert(logging.Filter):
    """Keeps a log record's text and stops the handler it is attached to from writing it."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(f"{record.name}: {record.getMessage()}")
        return False


class _Keep(logging.Handler):
    def __init__(self, divert: _Divert) -> None:
        super().__init__(logging.DEBUG)
        self.addFilter(divert)

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - the filter stops it
        return


@contextlib.contextmanager
def captured(notes: list[str], *, printed: bool = True) -> Iterator[None]:
    """Warnings and log records of the block go into ``notes`` instead of the user's output;
    with ``printed``, also what it writes to ``sys.stdout`` / ``sys.stderr``."""
    divert = _Divert()
    handlers = {id(h): h for h in logging.getLogger().handlers}
    for name in list(logging.root.manager.loggerDict):
        handlers.update({id(h): h for h in getattr(logging.getLogger(name), "handlers", [])})
    keep = _Keep(divert)  # records that would reach no handler (Python's last resort)
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
