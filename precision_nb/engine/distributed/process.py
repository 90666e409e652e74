"""torchrun as subprocesses: start each node's agent on a spec, follow them, stop them, and
describe a failure.

:func:`run_torchrun` picks a free port on the rendezvous host (loopback by default) unless the
request names one, runs one torchrun agent per node this machine runs (every node of the request,
or its ``node_rank`` only) through ``python -m precision_nb.engine.distributed.torchrun`` (torch's
``torch.distributed.run`` with its stores listening on that host only) with ``--max-restarts 0``,
calls ``poll()`` while the ranks train (the launcher follows their JSON-line logs there) and at
the end makes sure no worker outlives the run: a node whose agent fails ends the run on every
node; the agents are stopped with SIGTERM (which they forward), then their process groups and any
worker recorded on this machine are killed by id. :func:`.failure.failure` turns a failed run
into a ``DistributedError`` naming the node and rank that failed first, or the node whose agent
failed (killed, interrupted, a rendezvous that never completed).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from precision_nb.core.distributed import Distributed
from precision_nb.engine.distributed.failure import AgentEnd
from precision_nb.engine.distributed.nodes import NodeCommand, endpoint, loopback_env, node_command
from precision_nb.engine.distributed.results import (
    DistributedResult,
    RankResult,
    merge_records,
    read_rank_log,
)

__all__ = [
    "TorchrunRun",
    "agent_commands",
    "free_port",
    "read_ranks",
    "run_nodes",
    "run_torchrun",
    "stopped_not_failed",
]

log = logging.getLogger(__name__)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
_POLL_S = 0.05


def free_port(host: str) -> int:
    """A port the OS reports free on ``host`` (bound and released at once)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run_nodes(req: Distributed) -> dict[str, Any]:
    """The node layout of a request, as the run file records it (:func:`nodes.spec_nodes`)."""
    rdzv = {k: getattr(req, k) for k in ("rdzv_host", "rdzv_port", "rdzv_timeout_s")}
    return {"nnodes": req.nnodes, "nproc_per_node": req.nproc, **rdzv}


def agent_commands(req: Distributed, spec_path: Path, port: int) -> list[NodeCommand]:
    """The torchrun command of every node this machine runs (all of them when
    ``req.node_rank`` is None), with this interpreter."""
    layout = run_nodes(req)
    all_here = req.node_rank is None
    return [
        node_command(layout, node, spec_path, port=port, all_here=all_here)
        for node in req.nodes_here()
    ]


def _environment(host: str) -> dict[str, str]:
    env = {**loopback_env(host), **os.environ}  # the socket interfaces unless set already
    paths = [_PACKAGE_ROOT, os.getcwd(), *[p for p in sys.path if p]]
    if env.get("PYTHONPATH"):
        paths.insert(1, env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


@dataclass
class Agent:
    """One node's torchrun agent: its process, its log, when it ended and whether the launcher
    stopped it."""

    node: int
    proc: subprocess.Popen
    log_path: Path
    t_end: float | None = None
    stopped: bool = False

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def _start(command: NodeCommand, log_path: Path, env: dict[str, str]) -> Agent:
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            list(command.argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,  # command.env (the node's socket interfaces) is in it
            start_new_session=True,
        )
    return Agent(command.node, proc, log_path)


def _stop(agents: list[Agent], grace_s: float = 15.0) -> None:
    """SIGTERM every running agent (torchrun forwards it to its ranks), then wait for them."""
    running = [a for a in agents if a.proc.poll() is None]
    for a in running:
        a.stopped = True
        a.proc.send_signal(signal.SIGTERM)
    deadline = time.time() + grace_s
    for a in running:
        try:
            a.proc.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            log.warning(
                "node %d: torchrun did not stop within %.0f s after SIGTERM; killing it",
                a.node,
                grace_s,
            )


def _reap(proc: subprocess.Popen, ranks: list[RankResult], spec_path: Path) -> None:
    """Kill torchrun's process group and any recorded worker of this machine still running."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already: nothing to kill
    proc.wait()
    here = socket.gethostname()
    for r in ranks:
        if r.pid is None or (r.host is not None and r.host != here):
            continue
        try:
            p = psutil.Process(r.pid)
            if str(spec_path) in " ".join(p.cmdline()):
                p.kill()
                p.wait(5)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue


def read_ranks(run_dir: Path, plan: str | None = None) -> list[RankResult]:
    """Every rank whose log is in ``run_dir`` (``rank<R>.jsonl``), by rank; ``plan``: only that
    plan's lines (:func:`~precision_nb.engine.distributed.results.read_rank_log`)."""
    found = {path.stem[len("rank") :]: path for path in Path(run_dir).glob("rank*.jsonl")}
    ranks = sorted((int(digits), path) for digits, path in found.items() if digits.isdigit())
    return [read_rank_log(path, rank, plan=plan) for rank, path in ranks]


@dataclass
class TorchrunRun:
    """How one launch ended: exit code, the agents' logs, whether it was stopped, when it
    started; ``agents``: how each node's torchrun agent ended; ``endpoint``: the rendezvous."""

    returncode: int
    log_text: str
    stopped: bool
    t0: float
    seconds: float
    run_dir: Path
    agents: list[AgentEnd] = field(default_factory=list)
    endpoint: str = ""
    #: The first line of a failure's message (default: "distributed run failed (exit code)").
    headline: str = ""

    def failed(self, ranks: list[RankResult]) -> bool:
        """A rank or an agent failed (not the SIGTERM of a stop the caller asked for)."""
        if self.returncode == 0 and not any(r.error or not r.finished for r in ranks):
            return False
        return not (self.stopped and all(r.finished or r.error is None for r in ranks))

    def result(self, plan: Any, ranks: list[RankResult]) -> DistributedResult:
        """A DistributedResult of ``ranks`` (all the run's ranks, or their lines of one plan)."""
        result = DistributedResult(
            plan=plan,
            ranks=ranks,
            records=merge_records(ranks),
            seconds=self.seconds,
            stopped=self.stopped or any(r.stopped for r in ranks),
            log_tail=self.log_text[-4000:],
            run_dir=str(self.run_dir),
        )
        starts = [r.t_fit_start for r in ranks]
        if starts and all(s is not None for s in starts):
            result.startup_s = max(starts) - self.t0  # type: ignore[type-var]
        return result


def _end(agents: list[Agent], spec_path: Path, run_dir: Path) -> None:
    """Stop the agents still running, then kill their process groups and recorded ranks."""
    if any(a.proc.poll() is None for a in agents):
        _stop(agents, grace_s=5.0)
    now = time.time()
    ranks = read_ranks(run_dir)
    for a in agents:
        _reap(a.proc, ranks, spec_path)
        a.t_end = a.t_end or now


def _combined(agents: list[AgentEnd]) -> tuple[int, str]:
    """One exit code (the first failing agent's, else any non-zero, else 0) and one log."""
    failing = [a for a in agents if a.returncode not in (None, 0)]
    first = [a for a in failing if not a.stopped] or failing
    first.sort(key=lambda a: a.t_end or 0.0)
    code = int(first[0].returncode or 0) if first else 0
    if len(agents) == 1:
        return code, agents[0].log_text
    text = "\n".join(f"--- node {a.node} ---\n{a.log_text}" for a in agents)
    return code, text


def run_torchrun(
    req: Distributed, spec_path: Path, run_dir: Path, stop: Any, poll: Any
) -> TorchrunRun:
    """Run the agents of the nodes ``req.nodes_here()`` on ``spec_path`` (see the module docstring)
    until they end; stop them on ``stop``, Ctrl-C or ``req.timeout_s`` too."""
    port = req.rdzv_port if req.rdzv_port is not None else free_port(req.rdzv_host)
    commands = agent_commands(req, spec_path, port)
    env = _environment(req.rdzv_host)
    t0 = time.time()
    agents: list[Agent] = []
    stopped = ended_early = False
    try:
        for command in commands:
            name = "torchrun.log" if req.nnodes == 1 else f"torchrun-node{command.node}.log"
            agents.append(_start(command, run_dir / name, env))
        while [a.proc.poll() for a in agents].count(None):  # polls (and reaps) every agent
            now = time.time()
            for a in agents:
                if a.t_end is None and a.proc.returncode is not None:
                    a.t_end = now
            if not stopped and stop is not None and stop.is_set():
                stopped = True
                _stop(agents)
            elif not stopped and now - t0 > req.timeout_s:
                stopped = True
                log.warning("distributed run timed out after %.0f s; stopping it", req.timeout_s)
                _stop(agents)
            elif not (stopped or ended_early) and any(a.proc.returncode for a in agents):
                ended_early = True  # one node failed: end the run on every node
                _stop(agents)
            poll()
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        stopped = True
        try:
            _stop(agents)
        except KeyboardInterrupt:
            log.warning("interrupted again: killing every node's torchrun and its ranks now")
    except BaseException:
        _end(agents, spec_path, run_dir)  # a callback or a start failed: leave nothing running
        raise
    _end(agents, spec_path, run_dir)
    poll()
    ends = [AgentEnd(a.node, a.proc.returncode, a.t_end, a.stopped, a.log_text()) for a in agents]
    code, text = _combined(ends)
    run = TorchrunRun(code, text, stopped, t0, time.time() - t0, run_dir, ends)
    run.endpoint = endpoint(req.rdzv_host, port)
    return run


#: How a collective fails when its peer process has gone (gloo, NCCL): after a stop the caller
#: asked for, a rank waiting in one when another rank stopped was stopped by it.
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
             "remote process exited")  # fmt: skip


def stopped_not_failed(ranks: list[Any]) -> None:
    """After a stop the caller asked for, a rank interrupted by the SIGTERM that torchrun forwards
    (wherever it landed: in a step, in a collective, at teardown) stopped; it did not fail. So did
    a rank whose collective lost its peer because that peer had stopped first (the SIGTERM reaches
    the ranks one by one, and a rank blocked in a collective cannot take it before the peer's
    socket closes): its error says the peer is gone, and another rank stopped."""
    for rank in ranks:
        if rank.error is not None and rank.error.get("type") == "KeyboardInterrupt":
            _stopped(rank)
    if not any(r.stopped or (r.finished and r.error is None) for r in ranks):
        return
    for rank in ranks:
        message = str((rank.error or {}).get("message", ""))
        if rank.error is not None and any(words in message for words in PEER_GONE):
            _stopped(rank)


def _stopped(rank: Any) -> None:
    rank.error = None
    rank.finished = True
    if rank.result is not None:
        rank.result = {**rank.result, "stopped": True}
