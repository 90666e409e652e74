"""The report folder: check it, stage a report beside the old one, swap it in, clean up.

Only the standard library is imported, so the command line checks ``--out`` before torch loads.

:func:`write_files` is the one writer of a report folder (the profile report and
``precision-nb inspect``): every file is written into a hidden staging folder inside the output
folder (``.precision-nb.<pid>.<random>.partial``) and moved into place only when all of them are
written; the move backs up the files it replaces and puts them back if a move fails or Ctrl-C
arrives during it. So an interrupted, failed or disk-full write leaves the output folder as it
was. A staging folder left by a killed process is removed by the next run when its process is gone
or it is older than :data:`STALE_AFTER_S` (a report is written in seconds).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "STALE_AFTER_S",
    "ReportWriteError",
    "WriteInterrupted",
    "check_output_folder",
    "commit",
    "describe_write_error",
    "remove_stale",
    "staging_folder",
    "write_files",
]

log = logging.getLogger(__name__)

#: A staging folder untouched for this long is stale even if its process id is in use again.
STALE_AFTER_S = 600.0
_PREFIX = ".precision-nb."
_STAGING = re.compile(r"\.precision-nb\.(?P<pid>\d+)\.[^/]*\.partial")


class ReportWriteError(OSError):
    """The report could not be written (e.g. a full disk); the output folder was left as it was."""


class WriteInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a stop request) arrived while the report was written; the output folder was left
    as it was."""


def write_files(out: Path, files: Iterable[Any], *, stop: Any = None) -> dict[str, Path]:
    """Write ``files`` (each with a ``name`` in the folder and its bytes, ``data``: a
    ``sections.ReportFile``) into ``out`` all at once or not at all; file name -> path, in order.

    ``out`` is checked (``ValueError``) and created when missing; see :func:`commit` for what is
    replaced. A failed write raises :class:`ReportWriteError` (what could not be written, and the
    free space when the disk is full); Ctrl-C, or ``stop`` (anything with ``is_set()``) set by the
    time the files are written, raises :class:`WriteInterrupted`; either way ``out`` is left as it
    was.
    """
    out = Path(out)
    check_output_folder(out)
    staging, created = staging_folder(out)
    committed = False
    names: list[str] = []
    try:
        for item in files:
            if item.name in names or Path(item.name).name != item.name:
                raise ValueError(f"report file name {item.name!r} is repeated or not a plain name")
            try:
                (staging / item.name).write_bytes(item.data)
            except OSError as err:
                raise OSError(err.errno, err.strerror or str(err), str(out / item.name)) from err
            names.append(item.name)
        if stop is not None and stop.is_set():
            raise WriteInterrupted(f"stopped before the report was moved into {str(out)!r}")
        commit(staging, out)
        committed = True
    except OSError as err:
        message = describe_write_error(err, out)
        raise ReportWriteError(err.errno, f"{message}; {str(out)!r} was left as it was") from err
    finally:
        if not committed:  # remove the staging folder, and out too if this run created it
            shutil.rmtree(staging, ignore_errors=True)
            if created:
                with contextlib.suppress(OSError):  # not empty: someone else wrote into it
                    out.rmdir()
    log.info("wrote %d files into %s", len(names), out)
    return {name: out / name for name in names}


def _shown(out: Path) -> str:
    """``'out'``, plus the absolute path when the user wrote something relative like ``.``."""
    text = str(out)
    full = str(out.absolute())
    return repr(text) if text == full else f"{text!r} ({full})"


def check_output_folder(out: Path, field: str = "out") -> None:
    """``ValueError`` unless ``out`` is (or can become) a folder this process can write into;
    the message names ``field`` (the command line passes ``"--out"``)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{field}: {_shown(out)} exists and is not a folder; give a folder path")
    if out.is_dir():
        if not os.access(out, os.W_OK | os.X_OK):
            raise ValueError(f"{field}: folder {_shown(out)} is not writable")
        return
    parent = _existing_ancestor(out.absolute().parent)
    if not parent.is_dir():
        raise ValueError(
            f"{field}: {_shown(out)} cannot be created: {str(parent)!r} is not a folder"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(
            f"{field}: {_shown(out)} does not exist and cannot be created: {str(parent)!r} is "
            "not writable"
        )


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _pid_alive(pid: int) -> bool:
    try:
        with contextlib.suppress(PermissionError):  # exists, owned by someone else
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def remove_stale(out: Path, *, now: float | None = None) -> list[Path]:
    """Remove staging folders in ``out`` whose process is gone or that are older than
    :data:`STALE_AFTER_S`; returns what was removed."""
    out = Path(out)
    if not out.is_dir():
        return []
    now = time.time() if now is None else now
    removed = []
    for item in out.iterdir():
        match = _STAGING.fullmatch(item.name)
        if match is None or not item.is_dir() or int(match["pid"]) == os.getpid():
            continue
        age = now - item.stat().st_mtime
        if not _pid_alive(int(match["pid"])) or age > STALE_AFTER_S:
            shutil.rmtree(item, ignore_errors=True)
            removed.append(item)
            log.info("removed a stale partial report folder %s (age %.0f s)", item, age)
    return removed


def staging_folder(out: Path) -> tuple[Path, bool]:
    """A fresh hidden folder inside ``out`` (created if missing); returns it and whether ``out``
    was created here (so a failed run can remove it again)."""
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    staging = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}.", suffix=".partial", dir=out))
    return staging, created


@contextlib.contextmanager
def _sigint_held() -> Iterator[list[int]]:
    """Hold off Ctrl-C (main thread only) for a few milliseconds of renames; yields the signals
    that arrived, which the caller decides about once the block is done."""
    arrived: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield arrived
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(signum))
    try:
        yield arrived
    finally:
        signal.signal(signal.SIGINT, previous)


def commit(staging: Path, out: Path) -> list[str]:
    """Move every file of ``staging`` into ``out``; all of them or, on an error, none.

    Files of ``out`` with the same names are replaced; other files are left alone. Returns the
    names moved. Ctrl-C during the move is held off until the move is done, then every file is
    put back as it was and :class:`WriteInterrupted` is raised.
    """
    names = sorted(p.name for p in staging.iterdir())
    backup = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}.", suffix=".partial", dir=out))
    saved: list[str] = []
    moved: list[str] = []
    with _sigint_held() as arrived:
        try:
            for name in names:
                if (out / name).exists():
                    os.replace(out / name, backup / name)
                    saved.append(name)
            for name in names:
                os.replace(staging / name, out / name)
                moved.append(name)
            if arrived:
                raise WriteInterrupted("Ctrl-C arrived while the report was moved into place")
        except (OSError, WriteInterrupted):
            for name in moved:
                os.replace(out / name, staging / name)
            for name in saved:
                os.replace(backup / name, out / name)
            raise
        finally:
            shutil.rmtree(backup, ignore_errors=True)
    staging.rmdir()
    return names


def describe_write_error(err: OSError, out: Path) -> str:
    """One line: what could not be written, why, and how much space is free where ``out`` is."""
    what = f" {err.filename}" if err.filename else ""
    line = f"could not write{what}: {err.strerror or str(err)}"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        where = _existing_ancestor(Path(out).absolute())
        try:
            free = shutil.disk_usage(where).free
            line += f"; {free / 2**20:.1f} MiB free on the file system of {str(where)!r}"
        except OSError:
            line += f"; free space of {str(where)!r} unknown"
    return line
