"""The set-up every rank shares, one fit or a measured profile: process group, model, trainer, log.

Each rank joins the process group, builds the model the run file names, makes the engine's
:class:`~precision_nb.engine.trainer.Trainer` on its slice of every global batch, and writes its
JSON lines (:class:`RankLog`, :class:`CommObserver`, the memory by kind and dtype).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.callbacks import Callback
from precision_nb.engine.distributed.counting import CommCounter
from precision_nb.engine.distributed.nodes import node_identity, spec_nodes, world_problems
from precision_nb.engine.distributed.parallel import (
    RankBatches,
    bytes_by_dtype,
    observe_compute,
    sharding_summary,
)
from precision_nb.engine.request import prepare
from precision_nb.engine.run_setup import seed_everything
from precision_nb.engine.train_config import TrainConfig
from precision_nb.engine.trainer import Trainer

__all__ = [
    "CommObserver",
    "RankLog",
    "RankProbes",
    "build_model",
    "from_json",
    "import_path",
    "init_rank",
    "make_trainer",
    "train_config",
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
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    fixed = {
        k: tuple(v) if isinstance(defaults[k], tuple) and isinstance(v, list) else v
        for k, v in data.items()
    }
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


class CommObserver(Callback):
    """Trainer callback: collective bytes per logged interval, live records to the rank log
    (each line tagged with ``plan`` when one launch runs several plans)."""

    def __init__(self, log: RankLog, counter: CommCounter | None, plan: str | None = None) -> None:
        self.log, self.counter = log, counter
        self.tag = {} if plan is None else {"plan": plan}
        self.last_step = 0

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
        record["comm_bytes_per_step"] = sum(r["bytes_per_step"] for r in rows)
        self.log.write("record", record=record, comm=rows, **self.tag)


def build_model(
    spec: dict[str, Any], device: torch.device, seed: int | None
) -> tuple[Any, Any, dict]:
    """The model, its global batches and workload info, as the run file (spec.json) names them."""
    m = spec["model"]
    if "workload" in m:
        return prepare(m["workload"], None, m["preset"], device, seed)
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
    identities: list[Any] = [None] * world  # every rank's node: over the plain group, not counted
    dist.all_gather_object(identities, node_identity())
    problems = world_problems(spec_nodes(spec), world, identities)
    if problems:
        raise ValueError(
            "the nodes did not start the run the run file describes: " + "; ".join(problems)
        )
    return rank, world, device


def train_config(spec: dict[str, Any]) -> TrainConfig:
    """The run's TrainConfig (no progress bar on the ranks)."""
    return dataclasses.replace(from_json(TrainConfig, spec["train"]), progress=False)


def make_trainer(
    wrapped: Any, batches: Any, device: torch.device, spec: dict[str, Any], **kw: Any
) -> Any:
    """The engine's Trainer on this rank's slice of every global batch; ``kw``: ``precision``
    (a dict, default: the run file's), ``train`` (a TrainConfig) and ``workload_info``."""
    return Trainer(
        wrapped,
        RankBatches(batches, dist.get_rank(), dist.get_world_size()),
        device=device,
        precision=from_json(PrecisionConfig, kw.get("precision") or spec["precision"]),
        optimizer=from_json(OptimizerConfig, spec["optimizer"]),
        train=kw["train"],
        loss_fn=import_path(spec["loss_fn"]) if spec.get("loss_fn") else None,
        workload_info=kw["workload_info"],
    )


class RankProbes:
    """What a rank's wrapped model computes with (:func:`observe_compute`) and the gradients'
    bytes by dtype at the first optimizer step; :meth:`write` logs them with the bytes this rank
    holds by kind and dtype and its sharding."""

    def __init__(self, wrapped: Any, trainer: Any) -> None:
        self.trainer = trainer
        self.params = [p for p in wrapped.parameters() if p.requires_grad]
        self.memory: dict[str, Any] = {}
        self.compute: dict[str, Any] = {}
        observe_compute(wrapped, self.compute)

        def first_step(_opt: Any, _args: Any, _kwargs: Any) -> None:
            grads = (p.grad for p in self.params if p.grad is not None)
            self.memory["gradients"] = bytes_by_dtype(grads)
            handle.remove()

        handle = trainer.optimizer.register_step_pre_hook(first_step)

    def write(self, log: RankLog, **tag: Any) -> None:
        self.memory["parameters"] = bytes_by_dtype(self.params)
        states = self.trainer.optimizer.state.values()
        self.memory["optimizer_state"] = bytes_by_dtype(v for s in states for v in s.values())
        sharding = sharding_summary(self.params)
        log.write("memory", memory=self.memory, sharding=sharding, compute=self.compute, **tag)
