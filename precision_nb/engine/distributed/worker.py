"""The module ``torchrun`` runs on every rank (``-m precision_nb.engine.distributed.worker SPEC``).

Each rank builds the model (a built-in workload by name and preset, or a ``module:factory``
import path with an optional saved state dict), trains its slice of every global batch with the
engine's :class:`~precision_nb.engine.trainer.Trainer` on the model wrapped in DDP or sharded by
FSDP2, and appends what it records to ``rank<R>.jsonl`` in the run folder, one JSON line each:
``start`` (with the rank's node and host), ``fit_start``, every ``record`` as it is logged (with
the collective bytes since the previous one), then ``result`` or ``error``. After joining the
process group every rank checks that the nodes started what the run file describes
(:func:`check_world`). The launcher reads those lines, live and at the end,
so a rank that dies keeps every line it wrote.

A spec with ``plans`` (a distributed profile) runs every plan in this one launch and measures
them together: :mod:`precision_nb.engine.distributed.rank_measure`; its lines carry a ``plan``.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.distributed.counting import CommCounter, counting_group
from precision_nb.engine.distributed.nodes import node_identity, spec_nodes, world_problems
from precision_nb.engine.distributed.parallel import (
    RankBatches,
    bytes_by_dtype,
    observe_compute,
    optimizer_state_tensors,
    sharding_summary,
    wrap_model,
)
from precision_nb.engine.train_config import TrainConfig

__all__ = [
    "RankLog",
    "check_world",
    "from_json",
    "import_path",
    "init_rank",
    "main",
    "make_trainer",
    "run",
]


def import_path(path: str) -> Any:
    """The object named by ``"package.module:attribute"``."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(
            f"import path {path!r}: allowed form 'package.module:function' (an importable factory)"
        )
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def from_json(cls: type, data: dict[str, Any]) -> Any:
    """A dataclass from JSON data, lists turned back into tuples where the default is a tuple."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    fixed = {}
    for key, value in data.items():
        default = fields[key].default
        as_tuple = isinstance(value, list) and isinstance(default, tuple)
        fixed[key] = tuple(value) if as_tuple else value
    return cls(**fixed)


class RankLog:
    """Appends JSON lines to this rank's file, flushed at once (a killed rank keeps them)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, kind: str, **data: Any) -> None:
        self._file.write(json.dumps({"kind": kind, "t": time.time(), **data}, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class CommObserver:
    """Trainer callback: collective bytes per logged interval, live records to the rank log
    (each line tagged with ``plan`` when one launch runs several plans)."""

    def __init__(self, log: RankLog, counter: CommCounter | None, plan: str | None = None) -> None:
        self.log, self.counter = log, counter
        self.tag = {} if plan is None else {"plan": plan}
        self.last_step = 0
        self.comm: list[dict[str, Any]] = []

    def on_fit_start(self, result: Any) -> None:
        setup = self.counter.take() if self.counter else []
        self.log.write("fit_start", comm_setup=setup, workload=result.workload, **self.tag)

    def on_log(self, record: dict[str, Any]) -> None:
        steps = max(1, int(record["step"]) - self.last_step)
        self.last_step = int(record["step"])
        rows = self.counter.take() if self.counter else []
        for row in rows:
            row.update(
                step=record["step"],
                steps=steps,
                bytes_per_step=row["bytes"] / steps,
                seconds_per_step=row["seconds"] / steps,
            )
        self.comm.extend(rows)
        record["comm_bytes_per_step"] = sum(r["bytes_per_step"] for r in rows)
        self.log.write("record", record=record, comm=rows, **self.tag)


def build_model(
    spec: dict[str, Any], device: torch.device, seed: int | None
) -> tuple[Any, Any, dict]:
    """The model, its global batches and workload info, as the run file (spec.json) names them."""
    from precision_nb.engine.trainer import prepare

    m = spec["model"]
    if "workload" in m:
        return prepare(m["workload"], None, m["preset"], device, seed)
    from precision_nb.engine.trainer import seed_everything

    seed_everything(seed or 0)
    model = import_path(m["factory"])()
    if m.get("state_dict"):
        model.load_state_dict(torch.load(m["state_dict"], map_location="cpu", weights_only=True))
    batches = import_path(spec["batches"])()
    return model, batches, {"name": type(model).__name__}


def init_rank(spec: dict[str, Any]) -> tuple[int, int, torch.device]:
    """Join the process group of the run and check that the nodes started what the run file
    says (``ValueError`` naming the node otherwise); (rank, world size, this rank's device)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}") if spec["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=float(spec["timeout_s"]))
    dist.init_process_group(spec["plan"]["backend"], timeout=timeout)
    check_world(spec, world)
    return rank, world, device


def check_world(spec: dict[str, Any], world: int) -> None:
    """Every rank learns every rank's node (one all-gather over the plain group, not counted)
    and raises ``ValueError`` naming the nodes that differ from the run file's layout."""
    identities: list[Any] = [None] * world
    dist.all_gather_object(identities, node_identity())
    problems = world_problems(spec_nodes(spec), world, identities)
    if problems:
        raise ValueError(
            "the nodes did not start the run the run file describes: " + "; ".join(problems)
        )


def train_config(spec: dict[str, Any]) -> TrainConfig:
    """The run's TrainConfig (no progress bar on the ranks)."""
    return dataclasses.replace(from_json(TrainConfig, spec["train"]), progress=False)


def make_trainer(
    wrapped: Any, batches: Any, device: torch.device, spec: dict[str, Any], **kw: Any
) -> Any:
    """The engine's Trainer on this rank's slice of every global batch; ``kw``: ``precision``
    (a dict, default: the run file's), ``train`` (a TrainConfig) and ``workload_info``."""
    from precision_nb.engine.trainer import Trainer

    rank, world = dist.get_rank(), dist.get_world_size()
    return Trainer(
        wrapped,
        RankBatches(batches, rank, world),
        device=device,
        precision=from_json(PrecisionConfig, kw.get("precision") or spec["precision"]),
        optimizer=from_json(OptimizerConfig, spec["optimizer"]),
        train=kw["train"],
        loss_fn=import_path(spec["loss_fn"]) if spec.get("loss_fn") else None,
        workload_info=kw["workload_info"],
    )


def memory_probe(trainer: Any, params: list[Any], into: dict[str, Any]) -> None:
    """Record the gradients' bytes by dtype at the first optimizer step into ``into``."""

    def first_step(_opt: Any, _args: Any, _kwargs: Any) -> None:
        into["gradients"] = bytes_by_dtype(p.grad for p in params if p.grad is not None)
        handle.remove()

    handle = trainer.optimizer.register_step_pre_hook(first_step)


def write_memory(log: RankLog, trainer: Any, params: list[Any], memory: dict, **tag: Any) -> None:
    """Log the bytes this rank holds by kind and dtype, its sharding and what it computed with."""
    compute = tag.pop("compute", {})
    memory["parameters"] = bytes_by_dtype(params)
    memory["optimizer_state"] = bytes_by_dtype(optimizer_state_tensors(trainer.optimizer))
    log.write("memory", memory=memory, sharding=sharding_summary(params), compute=compute, **tag)


def run(spec: dict[str, Any], log: RankLog) -> None:
    if spec.get("plans"):
        from precision_nb.engine.distributed.rank_measure import run_measured

        run_measured(spec, log, STOP)
        return
    rank, world, device = init_rank(spec)
    plan = spec["plan"]
    counter = CommCounter() if plan["count_collectives"] else None
    group = counting_group(counter) if counter is not None else dist.group.WORLD
    train = train_config(spec)
    model, batches, info = build_model(spec, device, train.seed)
    info = dict(info, rank=rank, nproc=world)
    wrapped = wrap_model(model, plan, group, device)
    compute: dict[str, Any] = {}
    observe_compute(wrapped, compute)
    trainer = make_trainer(wrapped, batches, device, spec, train=train, workload_info=info)
    memory: dict[str, Any] = {}
    params = [p for p in wrapped.parameters() if p.requires_grad]
    memory_probe(trainer, params, memory)
    observer = CommObserver(log, counter)
    try:
        result = trainer.fit(callbacks=[observer])
    finally:
        write_memory(log, trainer, params, memory, compute=compute)
    log.write("result", result=result.to_dict())
    dist.destroy_process_group()


#: Set when torchrun asks this rank to stop (SIGTERM): a measured run stops between steps.
STOP = threading.Event()


def _terminate(signum: int, _frame: Any) -> None:
    # torchrun sends SIGTERM when another rank failed or the caller stopped the run: stop
    # between steps like Ctrl-C does (the trainer keeps every record made so far).
    STOP.set()
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    rank = int(os.environ["RANK"])
    log = RankLog(Path(spec["run_dir"]) / f"rank{rank}.jsonl")
    log.write("start", pid=os.getpid(), rank=rank, argv=args, node=node_identity())
    signal.signal(signal.SIGTERM, _terminate)
    try:
        run(spec, log)
    except BaseException as exc:  # noqa: BLE001 - recorded for the launcher, then exit code 1
        partial = getattr(exc, "precision_nb_result", None) or getattr(exc, "result", None)
        log.write(
            "error",
            type=type(exc).__name__,
            message=str(exc),
            traceback=traceback.format_exc(),
            result=partial.to_dict() if hasattr(partial, "to_dict") else None,
        )
        return 1
    finally:
        log.close()
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The rank's log is closed and its process group destroyed: leave without the interpreter's
    # teardown, where torch's C++ destructors can abort on a race between their threads
    # ("terminate called without an active exception", seen on a loaded machine), which would
    # turn a finished rank into a failed run.
    os._exit(status)
