"""Gather a run's folder into the result the launcher returns: the ranks' logs every node wrote
into one (shared) folder, read again after the run.

On a cluster the nodes' torchrun agents are started by hand or by ``srun`` on the run file
``write_spec`` wrote (:mod:`~precision_nb.engine.distributed.nodes`), each rank appending its
``rank<R>.jsonl`` beside it. :func:`gather` reads that folder: the run file (the plan is resolved
again from what it records, so a machine without the nodes' devices can gather), every rank's log,
the agents' ``node<K>.json`` and any torchrun logs, and returns the
:class:`~precision_nb.engine.distributed.results.DistributedResult` a launch on one machine gives
(records merged over every rank and per node, communication and memory tables). A rank that
failed, one still running, or ranks missing from the folder raise
:class:`~precision_nb.engine.distributed.results.DistributedError` naming the node and rank, as
the launcher does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from precision_nb.core.capabilities import Capabilities
from precision_nb.core.cpu_features import CpuFeatures
from precision_nb.core.distributed import Distributed, DistributedPlan, explain_distributed
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.distributed.failure import failure
from precision_nb.engine.distributed.nodes import endpoint, read_markers, spec_nodes
from precision_nb.engine.distributed.process import TorchrunRun, read_ranks
from precision_nb.engine.distributed.rank import from_json
from precision_nb.engine.distributed.results import DistributedError, DistributedResult, rank_lines

__all__ = ["gather", "read_spec", "resolve_spec"]

_HOW = (
    "allowed: the run folder of write_spec (spec.json) in which every rank wrote its "
    "rank<R>.jsonl (a folder every node shares)"
)


def read_spec(run_dir: str | Path) -> dict[str, Any]:
    """The run file in ``run_dir``; ``ValueError`` naming the folder when there is none."""
    folder = Path(run_dir)
    path = folder / "spec.json"
    if not path.is_file():
        raise ValueError(f"run_dir: invalid value {str(folder)!r}: no spec.json there; {_HOW}")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"run_dir: {str(path)!r} is not a readable run file ({exc})") from exc
    if not isinstance(spec, dict) or "plan" not in spec:
        raise ValueError(f"run_dir: {str(path)!r} is not a run file of precision_nb; {_HOW}")
    return spec


def _capabilities(data: dict[str, Any]) -> Capabilities:
    cpu, cc = data.get("cpu"), data.get("compute_capability")
    features = CpuFeatures(**cpu) if isinstance(cpu, dict) else None
    cc = tuple(cc) if cc is not None else None
    return Capabilities(**dict(data, cpu=features, compute_capability=cc))


def resolve_spec(spec: dict[str, Any]) -> DistributedPlan:
    """The run file's plan, resolved again on the capabilities recorded where it was written
    (a run file without them is resolved on this machine)."""
    precision = from_json(PrecisionConfig, spec["precision"])
    optimizer = from_json(OptimizerConfig, spec["optimizer"])
    resolved = spec.get("resolved")
    if resolved:
        request = Distributed(**resolved["request"])
        hardware = _capabilities(resolved["capabilities"])
        return explain_distributed(request, precision, resolved["device"], hardware, optimizer)
    plan, nodes = spec["plan"], spec_nodes(spec)
    request = Distributed(
        strategy=plan["strategy"],
        nproc=int(nodes["nproc_per_node"] or 1),
        nnodes=int(nodes["nnodes"]),
        backend=plan["backend"],
        comm_hook=plan["comm_hook"] or "none",
    )
    return explain_distributed(request, precision, spec["device"], optimizer=optimizer)


def _logs(folder: Path) -> str:
    texts = []
    for path in sorted(folder.glob("torchrun*.log")):
        texts.append(f"--- {path.name} ---\n{path.read_text(encoding='utf-8', errors='replace')}")
    return "\n".join(texts)


def _times(folder: Path, ranks: list[Any]) -> tuple[float, float]:
    """(first start seen: an agent's marker or a rank's start line, last line any rank wrote)."""
    starts = [float(m["t"]) for m in read_markers(folder).values() if "t" in m]
    starts += [r.t_start for r in ranks if r.t_start is not None]
    ends = []
    for r in ranks:
        lines = rank_lines(folder / f"rank{r.rank}.jsonl")
        ends += [float(x["t"]) for x in lines[-1:] if "t" in x]
    t0 = min(starts) if starts else 0.0
    return t0, max(ends) if ends else t0


def gather(run_dir: str | Path) -> DistributedResult:
    """Read the run folder ``run_dir`` into a ``DistributedResult`` (see the module docstring).

    ``ValueError`` when the folder holds no run file or no rank log; ``DistributedError`` when a
    rank failed, has not finished, or ranks of the planned world left no log (``.result`` keeps
    what was found). ``startup_s``: from the first agent's start (its ``node<K>.json``) to the
    last rank entering its fit loop; ``seconds``: to the last line any rank wrote.
    """
    folder = Path(run_dir)
    spec = read_spec(folder)
    if spec.get("plans"):
        raise ValueError(
            f"run_dir: {str(folder)!r} holds a distributed profile (several plans in one "
            "launch); allowed: the run folder of write_spec / fit_distributed (one plan)"
        )
    plan = resolve_spec(spec)
    ranks = read_ranks(folder)
    if not ranks:
        raise ValueError(
            f"run_dir: {str(folder)!r} holds no rank log (rank<R>.jsonl): the nodes have not "
            f"started the run yet, or wrote elsewhere; {_HOW}"
        )
    t0, t_end = _times(folder, ranks)
    nodes = spec_nodes(spec)
    where = endpoint(nodes["rdzv_host"], nodes["rdzv_port"])
    run = TorchrunRun(0, _logs(folder), False, t0, t_end - t0, folder, [], where)
    run.headline = f"distributed run in {str(folder)!r} failed"
    result = run.result(plan, ranks)
    if not run.failed(ranks) and not result.missing_ranks:
        return result
    going = [r for r in ranks if not r.finished and r.error is None]
    if going and not any(r.error for r in ranks):
        names = ", ".join(f"rank {r.rank} (node {r.node})" for r in going)
        result.error = (
            f"the run in {str(folder)!r} has not finished: {names} left no result yet (still "
            "running, or killed without a trace); gather again once every node's torchrun ended"
        )
        error = DistributedError(result.error, result, going[0].rank, going[0].node)
    elif run.failed(ranks):
        error = failure(result, run)
    else:
        result.error = f"{run.headline}: {_missing(result, folder)}"
        error = DistributedError(result.error, result, None)
    if result.missing_ranks and run.failed(ranks):
        error.args = (f"{error.args[0]}\n{_missing(result, folder)}",)
    raise error


def _missing(result: DistributedResult, folder: Path) -> str:
    markers = read_markers(folder)
    nnodes = getattr(result.plan, "nnodes", 1)
    absent = [k for k in range(nnodes) if k not in markers]
    ranks = ", ".join(str(r) for r in result.missing_ranks)
    text = f"rank(s) {ranks} of {result.world_size} left no log in {str(folder)!r}"
    if absent:
        text += f"; no agent of node(s) {', '.join(map(str, absent))} started on this folder"
    return text
