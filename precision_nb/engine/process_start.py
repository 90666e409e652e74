"""Start the fresh measuring processes: each one a new interpreter.

Every measuring process is started from scratch (``python -m precision_nb.engine.measure_worker
RUN_FILE``) and imports torch itself. Forking children from a server that imported torch once
would start them about twice as fast, but not as independent samples: much of what makes one
process's speedup differ from the next is fixed when an interpreter starts and imports torch,
and forked children inherit it: with the default workload's hand-written interleaved loop on a
2-CPU machine, the bf16/fp32 speedups of the children of one parent spread by a standard
deviation of 0.04-0.06 while the parents' means differed by up to 0.22, as much as interpreters
started from scratch spread. An interval over forked children then covers one parent's value,
not the machine's. ``benchmarks/bench_process_start.py`` measures it; docs/profiling.md gives
the runs.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["HOW", "Child", "Starts"]

#: How the processes are started, as the measurement's event says it.
HOW = "each started from scratch (python -m precision_nb.engine.measure_worker)"


class Starts:
    """Starts one measurement's fresh processes and counts them."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.count = 0

    def launch(self, spec: Path, stderr: Path) -> Child:
        command = [sys.executable, "-m", "precision_nb.engine.measure_worker", str(spec)]
        launched = time.time()  # wall clock: the worker reports its own times on the same clock
        # its own session: a Ctrl-C reaches this process only, which then ends the worker by id
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=err, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        self.count += 1
        return Child(proc, launched)


class Child:
    """A measuring process that was started: poll it, or end it."""

    def __init__(self, proc: subprocess.Popen, launched: float | None) -> None:
        self.proc = proc
        self.pid = proc.pid
        #: When it was started (``time.time()``), or None where that is not known.
        self.launched = launched

    def poll(self, timeout: float) -> int | None:
        """Its exit code once it ended, else None after waiting up to ``timeout`` s."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def end(self) -> None:
        """Ask it to stop, then kill it if it does not."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(timeout=5)
