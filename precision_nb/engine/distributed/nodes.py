"""Several nodes: the torchrun command of each node, what each node announces, and the check that
every node started the run the run file describes.

:func:`node_command` is the command the launcher runs for a node and the one printed for a
cluster (``precision-nb nodes RUN_DIR``, :func:`node_commands`, :func:`srun_command`): torchrun
(through :mod:`precision_nb.engine.distributed.torchrun`) with ``--nnodes``, ``--node-rank``, a c10d
rendezvous hosted by node 0 (``is_host``) that waits ``join_timeout`` seconds for every node, and
the worker module on the run file. torchrun's c10d rendezvous orders its agents by their address
and process id, not by ``--node-rank``; the node rank given on the command line is this project's
name for the node (``PRECISION_NB_NODE_RANK`` for the ranks; each agent also writes
``node<K>.json`` into the run folder as it starts).

Every rank checks, after the rendezvous, that the nodes started what the run file says
(:func:`world_problems`): the number of nodes, the processes of each node, the node ranks.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_nb.core.distributed import TORCHRUN_PORT, is_loopback

__all__ = [
    "NODE_RANK_ENV",
    "NNODES_ENV",
    "NodeCommand",
    "endpoint",
    "loopback_env",
    "node_command",
    "node_commands",
    "node_identity",
    "read_markers",
    "spec_nodes",
    "srun_command",
    "world_problems",
    "write_marker",
]

log = logging.getLogger(__name__)

#: The node rank the agent was started with (``--node-rank``), for its ranks.
NODE_RANK_ENV = "PRECISION_NB_NODE_RANK"
#: The ``--nnodes`` the agent was started with, for its ranks.
NNODES_ENV = "PRECISION_NB_NNODES"
#: The rendezvous id every node of a run uses.
RDZV_ID = "precision_nb"
_WORKER = "precision_nb.engine.distributed.worker"
_TORCHRUN = "precision_nb.engine.distributed.torchrun"


def loopback_env(host: str) -> dict[str, str]:
    """For a loopback ``host``, gloo's and NCCL's socket interface: this machine's loopback
    interface ("lo" on Linux), when it has one."""
    lo = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)
    if is_loopback(host) and lo is not None:
        return {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo}
    return {}


def endpoint(host: str, port: int | None) -> str:
    """``host:port`` (IPv6 in brackets); torchrun's default c10d port when ``port`` is None."""
    port = TORCHRUN_PORT if port is None else port
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class NodeCommand:
    """The torchrun agent of one node: environment variables to add, and its arguments."""

    node: int
    env: Mapping[str, str]
    argv: tuple[str, ...]

    def shell(self) -> str:
        """The command as one shell line (``VAR=value ... python -m ...``)."""
        parts = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join(parts + [shlex.quote(a) for a in self.argv])


def spec_nodes(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The run file's node layout (``nnodes``, ``nproc_per_node``, ``rdzv_host``, ``rdzv_port``,
    ``rdzv_timeout_s``); a run file without one describes one node."""
    nodes = spec.get("nodes") or {}
    return {
        "nnodes": int(nodes.get("nnodes", 1)),
        "nproc_per_node": nodes.get("nproc_per_node"),
        "rdzv_host": nodes.get("rdzv_host", "127.0.0.1"),
        "rdzv_port": nodes.get("rdzv_port"),
        "rdzv_timeout_s": float(nodes.get("rdzv_timeout_s", 300.0)),
    }


def node_command(
    nodes: Mapping[str, Any],
    node: int,
    spec_path: str | Path,
    *,
    port: int | None = None,
    python: str = sys.executable,
    all_here: bool = False,
) -> NodeCommand:
    """The torchrun command of ``node`` for a run file's node layout (:func:`spec_nodes`).

    ``port`` overrides the layout's port (the launcher's free port). Node 0 hosts the rendezvous
    store on the rendezvous host and listens there (``--local-addr``); the other nodes listen on
    their own address (torchrun's default, the host name) unless every node runs on this machine
    (``all_here``) or the host is loopback, where all use the rendezvous host.
    """
    nnodes, host = int(nodes["nnodes"]), str(nodes["rdzv_host"])
    nproc = int(nodes["nproc_per_node"])
    where = endpoint(host, port if port is not None else nodes.get("rdzv_port"))
    argv = [python, "-m", _TORCHRUN, f"--nnodes={nnodes}"]
    if nnodes > 1:
        argv.append(f"--node-rank={node}")
    argv += [f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint={where}"]
    if nnodes > 1:
        seconds = max(1, math.ceil(nodes["rdzv_timeout_s"]))
        # read_timeout: how long a node waits to reach node 0's store, as long as the join itself
        conf = f"join_timeout={seconds},read_timeout={max(10, seconds)},is_host={int(node == 0)}"
        argv += [f"--rdzv-id={RDZV_ID}", f"--rdzv-conf={conf}"]
    if node == 0 or all_here or is_loopback(host):
        argv.append(f"--local-addr={host}")
    argv += ["--max-restarts=0", "--monitor-interval=0.1", "-m", _WORKER, str(spec_path)]
    return NodeCommand(node, loopback_env(host), tuple(argv))


def node_commands(spec_path: str | Path, *, python: str = "python") -> list[NodeCommand]:
    """The command of every node of the run file at ``spec_path``, node 0 first."""
    nodes = spec_nodes(json.loads(Path(spec_path).read_text(encoding="utf-8")))
    if nodes["nproc_per_node"] is None:
        raise ValueError(
            f"run file {str(spec_path)!r}: it has no node layout ('nodes'); allowed: a run file "
            "written by write_spec of this version"
        )
    return [node_command(nodes, k, spec_path, python=python) for k in range(int(nodes["nnodes"]))]


def srun_command(spec_path: str | Path, *, python: str = "python") -> str:
    """One ``srun`` line starting every node's agent on a Slurm allocation: node rank
    ``$SLURM_NODEID``, node 0 hosting the rendezvous (run it where node 0 is ``rdzv_host``)."""
    commands = node_commands(spec_path, python=python)
    cmd = commands[-1]
    argv = []
    for arg in cmd.argv:
        if arg.startswith("--node-rank="):
            arg = "--node-rank=$SLURM_NODEID"
        elif arg.startswith("--rdzv-conf="):
            arg = arg.replace("is_host=0", "is_host=$((SLURM_NODEID == 0))")
        elif arg.startswith("--local-addr="):
            continue  # each node listens on its own address
        argv.append(arg if "$" in arg else shlex.quote(arg))
    inner = " ".join(argv)
    env = " ".join(f"{k}={v}" for k, v in cmd.env.items())
    inner = f"{env} {inner}" if env else inner
    return f"srun --nodes={len(commands)} --ntasks-per-node=1 bash -c {shlex.quote(inner)}"


def node_identity() -> dict[str, Any]:
    """What this rank knows of its node: the node rank it was started with (else torchrun's
    group rank), torchrun's group rank, local rank and processes on the node, the ``--nnodes``
    of its agent and the host name."""
    group = int(os.environ.get("GROUP_RANK", "0"))
    given, nnodes = os.environ.get(NODE_RANK_ENV), os.environ.get(NNODES_ENV)
    return {
        "node": int(given) if given else group,
        "group_rank": group,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "agent_nnodes": int(nnodes) if nnodes else None,
        "host": socket.gethostname(),
    }


def world_problems(
    nodes: Mapping[str, Any], world: int, identities: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Every way the ranks that met (``identities``, one per rank) differ from the run file's
    layout ``nodes`` (:func:`spec_nodes`), each naming the node; empty when they agree."""
    nnodes, per_node = int(nodes["nnodes"]), nodes.get("nproc_per_node")
    if per_node is None:
        return []
    expected = nnodes * int(per_node)
    problems = []
    if world != expected:
        problems.append(
            f"torchrun formed {world} ranks; the run file expects {nnodes} node(s) x "
            f"{per_node} process(es) = {expected}"
        )
    groups: dict[int, dict[str, Any]] = {}
    for ident in identities:
        groups.setdefault(int(ident["group_rank"]), dict(ident))
    by_node: dict[int, list[dict[str, Any]]] = {}
    for ident in groups.values():
        by_node.setdefault(int(ident["node"]), []).append(ident)
    for node, agents in sorted(by_node.items()):
        name = f"node {node} ({', '.join(sorted({str(a['host']) for a in agents}))})"
        if len(agents) > 1:
            problems.append(f"node rank {node} was given to {len(agents)} agents: {name}")
        if not 0 <= node < nnodes:
            problems.append(
                f"{name} has node rank {node}, out of range for {nnodes} node(s) "
                f"(allowed: 0 to {nnodes - 1})"
            )
        for agent in agents:
            if int(agent["local_world_size"]) != int(per_node):
                problems.append(
                    f"{name} started {agent['local_world_size']} process(es) "
                    f"(--nproc-per-node); the run file expects {per_node} per node"
                )
            if agent.get("agent_nnodes") not in (None, nnodes):
                problems.append(
                    f"{name} was started with --nnodes={agent['agent_nnodes']}; the run file "
                    f"says {nnodes}"
                )
    if len(groups) != nnodes:
        problems.append(f"{len(groups)} node(s) joined; the run file expects {nnodes}")
    return problems


def write_marker(run_dir: Path, node: int, nnodes: int, nproc: str | None) -> None:
    """Record in the run folder that node ``node``'s agent started (``node<K>.json``); a folder
    that cannot be written is logged, and the run goes on without the marker."""
    data = {
        "node": node,
        "nnodes": nnodes,
        "nproc_per_node": nproc,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "t": time.time(),
    }
    try:
        (run_dir / f"node{node}.json").write_text(json.dumps(data), encoding="utf-8")
    except OSError as exc:
        log.warning("node %d: cannot write its marker into %s: %s", node, run_dir, exc)


def read_markers(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Node rank -> the marker its agent wrote (:func:`write_marker`) in ``run_dir``."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted(Path(run_dir).glob("node*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            out[int(data["node"])] = data
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("unreadable node marker %s: left out", path)
    return out
