"""Start the fresh measuring processes: each one a new interpreter, two importing at a time.

Every measuring process is started from scratch (``python -m precision_nb.engine.measure_worker``)
and imports torch itself. Forking children from a server that imported torch once would start
them about twice as fast, but not as independent samples: much of what makes one process's
speedup differ from the next is fixed when an interpreter starts and imports torch, and forked
children inherit it: with the default workload's hand-written interleaved loop on a 2-CPU
machine, the bf16/fp32 speedups of the children of one parent spread by a standard deviation of
0.04-0.06 while the parents' means differed by up to 0.22, as much as interpreters started from
scratch spread. An interval over forked children then covers one parent's value, not the
machine's. ``benchmarks/bench_process_start.py`` measures it; docs/profiling.md gives the runs.

What can be shared without sharing a start is the time: a process spends about 2.5 s importing
torch and ``torch._dynamo`` before it measures anything. Where the machine has two CPUs or more,
a launch with no process waiting starts two at once (``measure_worker --standby``): both import
side by side, and only when both are ready does the first get its run file; the second waits,
idle (blocked on its standard input), and takes the next run file at once. So no process runs
while another measures, and every process is still a new interpreter. A standby that is not
needed is ended (:meth:`Starts.close`); one that dies while importing is replaced by a process
started for its run file alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

__all__ = ["HOW", "HOW_ALONE", "Child", "Starts"]

#: How the processes are started, as the measurement's event says it (two CPUs or more) ...
HOW = (
    "each started from scratch (python -m precision_nb.engine.measure_worker), two importing "
    "torch side by side, the second idle while the first measured"
)
#: ... and on one CPU, where two imports side by side would take as long as one after the other.
HOW_ALONE = "each started from scratch (python -m precision_nb.engine.measure_worker)"
#: Seconds a standby may take to import before it is given up (its run file goes to a new one).
READY_TIMEOUT_S = 120.0


class Child(Protocol):
    """A measuring process that was started: poll it, or end it."""

    pid: int
    #: When it was started (``time.time()``), or None where that is not known.
    launched: float | None

    def poll(self, timeout: float) -> int | None:
        """Its exit code once it ended, else None after waiting up to ``timeout`` s."""

    def end(self) -> None:
        """Ask it to stop, then kill it if it does not."""


class Starts:
    """Starts one measurement's fresh processes, two importing at a time, and counts them;
    ``stop`` (an event) ends a wait for imports early. :meth:`close` ends a standby left."""

    def __init__(self, env: dict[str, str], stop: Any = None, cpus: int | None = None) -> None:
        self.env, self.stop = env, stop
        self.count = 0
        cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
        self.paired = cpus >= 2
        self.how = HOW if self.paired else HOW_ALONE
        self.standby: _Process | None = None
        #: Whether the last launch handed its run file to a process that had already imported.
        self.last_was_ready = False

    @property
    def used(self) -> bool:
        return self.count > 0

    @property
    def ready(self) -> bool:
        """Whether a process has imported and waits for the next run file."""
        return self.standby is not None

    def launch(self, spec: Path, stderr: Path) -> Child:
        self.count += 1
        waiting, self.standby = self.standby, None
        self.last_was_ready = waiting is not None
        if waiting is not None and waiting.go(spec, stderr):
            return waiting
        if self.paired and waiting is None:
            first, second = self._start(stderr), self._start(stderr.with_suffix(".standby"))
            ready = first.wait_ready(self.stop)
            if second.wait_ready(self.stop):  # the first measures only once both have imported
                self.standby = second
            else:
                second.end()
            if ready and first.go(spec, stderr):
                return first
            first.end()
        self.last_was_ready = False
        return self._start(stderr, spec)

    def close(self) -> None:
        """End the process left waiting, if any (the measurement needs no more)."""
        if self.standby is not None:
            self.standby.end()
            self.standby = None

    def _start(self, stderr: Path, spec: Path | None = None) -> _Process:
        arg = ["--standby"] if spec is None else [str(spec)]
        command = [sys.executable, "-m", "precision_nb.engine.measure_worker", *arg]
        pipe = subprocess.PIPE if spec is None else subprocess.DEVNULL
        launched = time.time()  # wall clock: the worker reports its own times on the same clock
        # its own session: a Ctrl-C reaches this process only, which then ends the worker by id
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(
                command, stdin=pipe, stdout=pipe, stderr=err, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        return _Process(proc, launched)


class _Process:
    def __init__(self, proc: subprocess.Popen, launched: float) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.launched = launched

    def wait_ready(self, stop: Any = None, timeout: float = READY_TIMEOUT_S) -> bool:
        """Whether a standby said ``ready`` (False: it ended, ``stop`` was set or it took longer
        than ``timeout``)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and not (stop is not None and stop.is_set()):
            readable, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if readable:
                return self.proc.stdout.readline().strip() == b"ready"
            if self.proc.poll() is not None:
                return False
        return False

    def go(self, spec: Path, stderr: Path) -> bool:
        """Hand a standby its run file (False: it is gone)."""
        told = json.dumps({"spec": str(spec), "stderr": str(stderr)}) + "\n"
        try:
            self.proc.stdin.write(told.encode())
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            return False
        return True

    def poll(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def end(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(timeout=5)
