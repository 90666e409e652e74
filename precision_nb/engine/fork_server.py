"""Start fresh measuring processes without paying for torch's import each time: a fork server.

Importing torch costs a fresh interpreter a second or more, often more than the measurement it
starts for. A fork server (``python -m precision_nb.engine.fork_server``, started once per
measurement) imports torch and the measuring modules, then forks one child per measuring process;
the child runs :func:`precision_nb.engine.measure_worker.main` on its run file and exits.

**Each child is still a fresh process's sample.** The server runs no tensor operation, so nothing
of what makes processes differ exists before the fork: the child builds the model, its batches and
optimizer state, and so every tensor allocation, the allocator's caches and growth, oneDNN's
primitive caches and kernel choices, torch's thread pools (OpenMP and inter-op, started by the
child's first operation: none exists in the server to be copied half-initialised) and CUDA (never
initialised in the server) start from nothing in each child, on physical pages of its own. Address
space randomisation is applied when a program starts, so the children would all inherit the
server's layout: each child therefore shifts its heap and its memory map by a random number of
pages before it builds anything. What the children share with the server: the loaded libraries at
the server's addresses and Python's hash seed. Where fork is not safe (not Linux) or
``PRECISION_NB_FRESH_START=exec`` asks for it, every process is started from scratch instead
(:class:`ExecStarter`); what started the processes is recorded with the measurement.

The server speaks JSON lines: it answers ``{"ready": seconds}`` once imported, then for each
``{"spec": path, "stderr": path, "target": "module:function"}`` it reads, ``{"pid": n}`` and,
when that child ends, ``{"exit": code}``. It ends when its standard input closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Protocol

__all__ = [
    "ENV_START",
    "Child",
    "ExecStarter",
    "ForkServer",
    "StartFailed",
    "Starts",
    "fork_is_safe",
    "starter",
]

#: ``exec``: start every measuring process from scratch; ``fork`` (the default where fork is
#: safe): fork them from a server that imported torch once.
ENV_START = "PRECISION_NB_FRESH_START"
#: What a child runs: the measuring worker's ``main([run_file])``.
WORKER = "precision_nb.engine.measure_worker:main"
#: Seconds to wait for the server's imports before falling back to starting from scratch.
READY_TIMEOUT_S = 120.0
#: What the server imports before it forks (everything a measuring child needs).
PRELOAD = (
    "torch",
    "torch._dynamo",  # imported by the first optimizer a process builds (sympy with it): seconds
    "torch.utils.flop_counter",
    "torch.profiler",
    "cloudpickle",
    "psutil",
    "precision_nb.engine.measure_worker",
    "precision_nb.engine.measure",
    "precision_nb.engine.measure_processes",
    "precision_nb.engine.trainer",
    "precision_nb.engine.request",
    "precision_nb.engine.shipping",
    "precision_nb.engine.workloads",
    "precision_nb.core.optim",
)


class StartFailed(RuntimeError):
    """The fork server could not be started; ``str()`` says why."""


class Child(Protocol):
    """A measuring process that was started: poll it, or end it."""

    pid: int

    def poll(self, timeout: float) -> int | None:
        """Its exit code once it ended, else None after waiting up to ``timeout`` s."""

    def end(self) -> None:
        """Ask it to stop, then kill it (by its own id) if it does not."""


class ExecStarter:
    """Starts each measuring process from scratch (``python -m ...measure_worker RUN_FILE``)."""

    how = "started from scratch (python -m precision_nb.engine.measure_worker)"

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.ready_s = 0.0

    def launch(self, spec: Path, stderr: Path) -> Child:
        command = [sys.executable, "-m", "precision_nb.engine.measure_worker", str(spec)]
        # its own session: a Ctrl-C reaches this process only, which then ends the worker by id
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=err, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        return _ExecChild(proc)

    def close(self) -> None:
        return None


class _ExecChild:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pid = proc.pid

    def poll(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def end(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(timeout=5)


class ForkServer:
    """The client of one fork server (see the module docstring); :class:`StartFailed` when it
    does not answer ready within ``timeout`` s (its error output is in the message)."""

    how = "forked from a server that imported torch once (precision_nb.engine.fork_server)"

    def __init__(self, env: dict[str, str], folder: Path, timeout: float = READY_TIMEOUT_S):
        self.errors = folder / "fork_server.err"
        started = time.perf_counter()
        with open(self.errors, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "precision_nb.engine.fork_server"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                start_new_session=True, text=True, bufsize=1,
            )  # fmt: skip
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, name="precision-nb-fork-server", daemon=True).start()
        answer = self._next(timeout)
        if answer is None or "ready" not in answer:
            self.close()
            tail = self.errors.read_text(encoding="utf-8", errors="replace").strip()
            last = " | ".join(tail.splitlines()[-3:]) or "no answer"
            raise StartFailed(f"the fork server did not start ({last})")
        self.ready_s = time.perf_counter() - started

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(json.JSONDecodeError):
                self.lines.put(json.loads(line))
        self.lines.put(None)  # the server ended

    def _next(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def launch(self, spec: Path, stderr: Path, target: str = WORKER) -> Child:
        """Fork a child that runs ``target`` (``module:function``), called with the path of the
        worker file as its one argument."""
        assert self.proc.stdin is not None
        request = {"spec": str(spec), "stderr": str(stderr), "target": target}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._next(READY_TIMEOUT_S)
        if answer is None or "pid" not in answer:
            raise StartFailed(f"the fork server did not fork a process (answer: {answer})")
        return _ForkedChild(self, int(answer["pid"]))

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # the server ends at the end of its input
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


class _ForkedChild:
    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.code: int | None = None

    def poll(self, timeout: float) -> int | None:
        if self.code is None:
            answer = self.server._next(timeout)
            if answer is None and self.server.proc.poll() is not None:
                self.code = -1  # the server itself ended: so did its child
            elif answer is not None:
                self.code = int(answer.get("exit", -1))
        return self.code

    def end(self) -> None:
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            deadline = time.perf_counter() + wait
            while self.poll(0.1) is None and time.perf_counter() < deadline:
                pass
            if self.code is not None:
                return


def fork_is_safe() -> bool:
    """Fork without exec is safe for torch on Linux; macOS frameworks and Windows are not."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def starter(env: dict[str, str], folder: Path) -> tuple[ForkServer | ExecStarter, str]:
    """The way to start measuring processes here, and why it is not the fork server ("" when
    it is): :data:`ENV_START`, the platform, or the server failing to start."""
    asked = os.environ.get(ENV_START, "fork").strip().lower()
    if asked not in ("fork", "exec"):
        raise ValueError(f"{ENV_START}: invalid value {asked!r}; allowed: fork, exec")
    if asked == "exec":
        return ExecStarter(env), f"{ENV_START}=exec"
    if not fork_is_safe():
        return ExecStarter(env), f"fork without exec is not safe for torch on {sys.platform}"
    try:
        return ForkServer(env, folder), ""
    except StartFailed as exc:
        return ExecStarter(env), str(exc)


class Starts:
    """How one measurement starts its fresh processes: chosen (:func:`starter`) at the first
    start, so a measurement that starts none starts no server either."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self.env, self.folder = env, folder
        self.starter: ForkServer | ExecStarter | None = None
        self.why_not_fork = ""

    @property
    def used(self) -> bool:
        return self.starter is not None

    @property
    def how(self) -> str:
        return "" if self.starter is None else self.starter.how

    def get(self) -> ForkServer | ExecStarter:
        if self.starter is None:
            self.starter, self.why_not_fork = starter(self.env, self.folder)
        return self.starter

    def describe(self) -> str:
        if self.starter is None:
            return "none started"
        ready = self.starter.ready_s
        server = f" (the server was ready in {ready:.1f} s)" if ready else ""
        why = f"; not forked: {self.why_not_fork}" if self.why_not_fork else ""
        return f"{self.how}{server}{why}"

    def close(self) -> None:
        if self.starter is not None:
            self.starter.close()


# ---------------------------------------------------------------------------- the server side


def _shift_layout() -> Any:
    """Move this child's heap and memory map by a random number of pages (and the heap by a
    random number of bytes), as address-space randomisation would have at a fresh start."""
    import mmap

    draw = int.from_bytes(os.urandom(4), "little")
    pages = 1 + draw % 256
    return mmap.mmap(-1, pages * mmap.PAGESIZE), bytearray(16 * ((draw >> 8) % 4096))


def _child(request: dict[str, Any]) -> None:
    """The forked child: its own standard streams, a shifted layout, one measurement; never
    returns."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDWR)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((0, null), (1, null), (2, err)):
            os.dup2(target, fd)
        kept = _shift_layout()
        import importlib

        module, _, function = request.get("target", WORKER).partition(":")
        code = getattr(importlib.import_module(module), function)([request["spec"]])
        del kept
    except BaseException:  # noqa: BLE001 - a child's failure goes to its error file and exit code
        import traceback

        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def serve(stdin: IO[str], stdout: IO[str]) -> int:
    """The server: import, answer ready, fork one child per request, report its exit."""
    import gc
    import importlib

    started = time.perf_counter()
    for name in PRELOAD:
        importlib.import_module(name)
    gc.freeze()  # the imported objects stay out of the children's collections (fewer page copies)
    stdout.write(json.dumps({"ready": time.perf_counter() - started}) + "\n")
    stdout.flush()
    for line in stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        stdout.write(json.dumps({"pid": pid}) + "\n")
        stdout.flush()
        _, status = os.waitpid(pid, 0)
        stdout.write(json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\n")
        stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.stdin, sys.stdout))
