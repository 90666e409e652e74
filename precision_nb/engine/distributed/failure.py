"""What went wrong in a torchrun run, in words: the node and rank that failed first (by signal or
exit code), or the node whose agent failed (killed, interrupted, a rendezvous that never
completed), as a ``DistributedError`` carrying every rank's result.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from precision_nb.core.distributed import Distributed
from precision_nb.engine.distributed.nodes import read_markers
from precision_nb.engine.distributed.results import DistributedError, DistributedResult, RankResult

if TYPE_CHECKING:
    from precision_nb.engine.distributed.process import TorchrunRun

__all__ = ["AgentEnd", "agent_trouble", "exit_codes", "failure", "root_cause"]

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


def exit_codes(log_text: str) -> dict[int, int]:
    """Each failed rank's exit code from torchrun's failure report (negative: killed by signal)."""
    pattern = r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)"
    return {int(r): int(c) for r, c in re.findall(pattern, log_text)}


def _signal_name(number: int) -> str:
    return signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"


def _stop_error(r: RankResult) -> bool:
    """The rank's error is the SIGTERM of a run being ended (its own KeyboardInterrupt)."""
    return r.error is not None and r.error.get("type") == "KeyboardInterrupt"


def _describe(r: RankResult, exit_code: int | None) -> str:
    if _stop_error(r):
        return "was stopped when the run ended (SIGTERM)"
    if r.error is not None:
        frames = [
            ln.strip()
            for ln in (r.error.get("traceback") or "").splitlines()
            if ln.strip().startswith('File "')
        ]
        outside = [f for f in frames if _TORCH_DIR not in f]
        where = f" ({(outside or frames)[-1]})" if frames else ""
        return f"raised {r.error.get('type')}: {r.error.get('message')}{where}"
    if exit_code is not None and exit_code < 0:
        name = _signal_name(-exit_code)
        return f"was killed by signal {name} (exit code {exit_code}) and left no error"
    if not r.finished:
        return f"ended without a result (exit code {exit_code})"
    return "stopped between steps (its result is kept)" if r.stopped else "finished"


def root_cause(ranks: list[RankResult], codes: dict[int, int]) -> int | None:
    """The rank that failed first: one that ended with neither a result nor an error (killed),
    else the earliest recorded error (one of its own before the SIGTERM of a run being ended),
    else the first rank torchrun reports. A rank killed by a signal the agent stops ranks with
    (SIGINT, SIGTERM) is not the cause when another rank raised an error of its own: on a busy
    machine the agent's signal can reach a rank before it records the stop."""
    raised = any(r.error is not None and not _stop_error(r) for r in ranks)
    stops = {-int(signal.SIGINT), -int(signal.SIGTERM)}
    killed = [
        r.rank
        for r in ranks
        if not r.finished and r.error is None and not (raised and codes.get(r.rank) in stops)
    ]
    if killed:
        return min(killed, key=lambda k: (codes.get(k, 0) >= 0, k))
    errors = [r for r in ranks if r.error is not None]
    if errors:
        first = min(errors, key=lambda r: (_stop_error(r), r.error["t"]))  # type: ignore[index]
        return first.rank
    return min(codes) if codes else None


@dataclass(frozen=True)
class AgentEnd:
    """How one node's torchrun agent ended: exit code, when, whether the launcher stopped it."""

    node: int
    returncode: int | None
    t_end: float | None
    stopped: bool
    log_text: str


#: How a torchrun agent logs a signal it received (its number in the group).
_AGENT_SIGNAL = re.compile(r"SignalException: Process \d+ got signal: (\d+)")


def agent_trouble(agent: AgentEnd, endpoint: str) -> str | None:
    """What went wrong with the agent itself (killed, interrupted, no rendezvous), or None when
    it failed because a rank failed (the ranks' records tell that)."""
    code, text = agent.returncode, agent.log_text
    # a signal it logged first, other than the launcher's SIGTERM, is the cause even when the
    # launcher's SIGTERM then ended it (exit code -15) while it waited for its ranks to stop
    if code is not None and code < 0 and not _signalled_before_the_stop(agent):
        name = _signal_name(-code)
        return f"its torchrun agent was killed by signal {name} (exit code {code})"
    got = _AGENT_SIGNAL.search(text)
    if got:
        name = _signal_name(int(got.group(1)))
        ctrl_c = " (Ctrl-C)" if name == "SIGINT" else ""
        return f"its torchrun agent received {name}{ctrl_c} and stopped its ranks"
    if "RendezvousTimeoutError" in text:
        return f"its torchrun agent timed out waiting at the rendezvous {endpoint}"
    if "RendezvousConnectionError" in text:
        return f"its torchrun agent could not reach the rendezvous store at {endpoint}"
    if "--node-rank: invalid value" in text:
        return next(ln.strip() for ln in text.splitlines() if "--node-rank: invalid value" in ln)
    if exit_codes(text) or "ChildFailedError" in text:
        return None
    last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "no output")
    return f"its torchrun agent exited with code {code}: {last}"


def _rendezvous_failure(run: TorchrunRun, req: Distributed) -> tuple[str, list[int]]:
    """What kept the rendezvous from completing, and the nodes whose agent left no marker in the
    run folder (never started on it)."""
    joined = read_markers(run.run_dir)
    missing = [k for k in range(req.nnodes) if k not in joined]
    started = ", ".join(
        f"node {k} ({m.get('host')})" for k, m in sorted(joined.items()) if k < req.nnodes
    )
    head = (
        f"the rendezvous at {run.endpoint} did not complete within {req.rdzv_timeout_s:g} s "
        f"(rdzv_timeout_s) for {req.nnodes} nodes"
    )
    if missing:
        names = ", ".join(str(k) for k in missing)
        return (
            f"{head}: node {names} never joined (started: {started or 'none'}); start it with "
            "its command from precision-nb nodes RUN_DIR; no rank ran"
        ), missing
    return (
        f"{head}: every node's agent started ({started}) but they did not meet: check that each "
        f"reaches {run.endpoint}; no rank ran"
    ), missing


def _from_outside(agent: AgentEnd) -> bool:
    """The agent was signalled, or its rendezvous never completed: a cause, not a consequence."""
    text = agent.log_text
    return (
        (agent.returncode or 0) < 0 or "SignalException" in text or "RendezvousTimeoutError" in text
    )


def _signalled_before_the_stop(agent: AgentEnd) -> bool:
    """The agent's first signal was not the launcher's SIGTERM: it came from outside, before the
    launcher stopped the run."""
    got = _AGENT_SIGNAL.search(agent.log_text)
    return got is not None and int(got.group(1)) != signal.SIGTERM


def _first_failed_agent(run: TorchrunRun) -> AgentEnd | None:
    """The agent that failed first; one stopped from outside (a signal, no rendezvous) before
    any other. A signalled agent waits for its ranks to stop between steps, so another node's
    agent, whose rank lost its connection meanwhile, can end earlier, and the launcher then
    stops the signalled one too (which its log's first signal tells apart)."""
    failed = [
        a
        for a in run.agents
        if a.returncode not in (None, 0) and (not a.stopped or _signalled_before_the_stop(a))
    ]
    return min(failed, key=lambda a: (not _from_outside(a), a.t_end or 0.0)) if failed else None


def _who(r: RankResult, multinode: bool) -> str:
    return f"node {r.node}, rank {r.rank}" if multinode and r.node is not None else f"rank {r.rank}"


def failure(result: DistributedResult, run: TorchrunRun) -> DistributedError:
    """A ``DistributedError`` naming what failed first: a rank (its node, its error or signal),
    else a node's torchrun agent (killed, interrupted, a rendezvous that never completed)."""
    req = getattr(result.plan, "request", None)
    multinode = bool(req is not None and req.nnodes > 1)
    codes = exit_codes(run.log_text)
    by_rank = {r.rank: r for r in result.ranks}
    agent = _first_failed_agent(run)
    trouble = agent_trouble(agent, run.endpoint) if agent is not None else None
    root = root_cause(result.ranks, codes)
    own = root in by_rank and not _stop_error(by_rank[root])
    node: int | None = None
    lines = [run.headline or f"distributed run failed (torchrun exit code {run.returncode})"]
    # A signal to a node's agent or a rendezvous that never completed comes first: the other
    # nodes' ranks then fail on the lost connection. Otherwise a rank's own error is the cause.
    outside = agent is not None and _from_outside(agent)
    if agent is not None and trouble is not None and (outside or not own):
        node, root = agent.node, None
        if "RendezvousTimeoutError" in agent.log_text and req is not None:
            text, missing = _rendezvous_failure(run, req)
            lines[0] += f": {text}"
            node = (missing or [agent.node])[0]
        else:
            lines[0] += f": node {agent.node}: {trouble}"
    elif root is not None and root in by_rank:
        r = by_rank[root]
        node = r.node
        lines[0] += f": {_who(r, multinode)} {_describe(r, codes.get(root))}"
    for r in result.ranks:
        if r.rank != root:
            state = _describe(r, codes.get(r.rank))
            lines.append(f"  {_who(r, multinode)}: {len(r.records)} record(s) kept; {state}")
    for a in run.agents:
        if multinode and a.node != node and a.returncode not in (0, None) and not a.stopped:
            trouble_of = agent_trouble(a, run.endpoint)
            if trouble_of is not None:
                lines.append(f"  node {a.node}: {trouble_of}")
    if result.ranks:
        lines.append("every rank's records are in error.result.ranks")
    result.error = lines[0]
    return DistributedError("\n".join(lines), result, root, node)
