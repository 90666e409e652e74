"""Launches shared by the distributed tests (each torchrun launch costs seconds on a loaded
2-core machine, so one run feeds many assertions) and the probes they carry.

``one_node`` (2 processes on one node) and ``two_nodes`` (the same 2 ranks as two torchrun agents
of one process each) train the tiny MLP for the same steps on the same batches, each keeping its
run folder so that it can be gathered again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from precision_nb.core.distributed import Distributed
from precision_nb.engine.distributed import fit_distributed

STEPS = 4


def listening(pids: list[int]) -> list[tuple[int, str, str]]:
    """(pid, process name, local address) of every listening TCP socket of these processes."""
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((pid, proc.name(), conn.laddr.ip))
        except psutil.NoSuchProcess:
            continue
    return found


def launched() -> list[psutil.Process]:
    """The processes the launcher started: its torchrun agents and everything under them (not
    other children of the test process, such as a server an earlier test left running)."""
    agents = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "precision_nb.engine.distributed.torchrun" in " ".join(child.cmdline()):
                agents.append(child)
        except psutil.NoSuchProcess:
            continue
    found = {p.pid: p for p in agents}
    for agent in agents:
        try:
            found.update((c.pid, c) for c in agent.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


class SocketProbe:
    """While a launch runs: the listening sockets of every process the launcher started, and the
    command lines of those processes (by pid), polled from a thread every ``interval_s``.

    Polling, not a look at rank 0's first record: on a loaded machine the launcher can hand that
    record to the callbacks after the ranks of a short run have already ended.
    """

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.found: set[tuple[int, str, str]] = set()
        self.by_pid: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="socket-probe", daemon=True)

    @property
    def sockets(self) -> list[tuple[int, str, str]]:
        return sorted(self.found)

    @property
    def cmdlines(self) -> list[str]:
        return list(self.by_pid.values())

    def __enter__(self) -> SocketProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.is_set():
            children = launched()
            self.found.update(listening([c.pid for c in children]))
            for c in children:
                if c.pid not in self.by_pid:
                    try:
                        self.by_pid[c.pid] = " ".join(c.cmdline())
                    except psutil.NoSuchProcess:
                        continue
            self._stop.wait(self.interval_s)


class Collector:
    """Rank 0's records as the callbacks see them, and the result handed to ``on_fit_end``."""

    def __init__(self) -> None:
        self.logged: list[dict] = []
        self.ended = None

    def on_log(self, record: dict) -> None:
        self.logged.append(record)

    def on_fit_end(self, result) -> None:
        self.ended = result


@dataclass
class Launch:
    """A finished run with the callbacks that followed it."""

    result: Any
    collector: Collector
    probe: SocketProbe
    run_dir: Path
    extra: dict[str, Any] = field(default_factory=dict)


def launch(run_dir: Path, nproc: int, nnodes: int = 1) -> Launch:
    collector = Collector()
    with SocketProbe() as probe:
        result = fit_distributed(
            "mlp",
            distributed=Distributed("ddp", nproc, nnodes=nnodes, timeout_s=240),
            device="cpu",
            steps=STEPS,
            log_every=1,
            measure_peak=False,
            callbacks=[collector],
            run_dir=run_dir,
        )
    return Launch(result, collector, probe, run_dir)


def leftovers(marker: str) -> list[psutil.Process]:
    """Live processes whose command line names ``marker`` (a run folder)."""
    alive = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if marker in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            alive.append(p)
    return alive
