"""``fit_distributed``: start the ranks with ``torchrun`` (a subprocess), follow rank 0 live and
gather every rank's records.

The calling process (a notebook kernel, a script, the CLI) is the launcher, never a rank. It runs
torchrun as :mod:`~precision_nb.engine.distributed.process` describes, reading the ranks'
JSON-line logs while they train (rank 0's records go to the callbacks as they are logged).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from precision_nb.core.distributed import Distributed, DistributedPlan, explain_distributed
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.batches import BatchSource
from precision_nb.engine.callbacks import Callbacks
from precision_nb.engine.distributed.failure import failure
from precision_nb.engine.distributed.parallel import batch_samples, check_divisible
from precision_nb.engine.distributed.process import (
    read_ranks,
    run_nodes,
    run_torchrun,
    stopped_not_failed,
)
from precision_nb.engine.distributed.rank import import_path
from precision_nb.engine.distributed.results import DistributedResult, merge_records, rank_lines
from precision_nb.engine.request import RunRequest
from precision_nb.engine.results import attach_result
from precision_nb.engine.workloads import WORKLOADS, Workload, get_workload

__all__ = [
    "Rank0Follower",
    "fit_distributed",
    "launch",
    "plan_spec",
    "write_request_spec",
    "write_spec",
]

log = logging.getLogger(__name__)


def _model_spec(
    model: Any, batches: Any, preset: str, factory: str | None, run_dir: Path, req: Distributed
) -> tuple[dict[str, Any], str | None]:
    """How workers rebuild the model (and batches), checked here before anything starts."""
    how = (
        "a model object from this process cannot be sent to torchrun workers: pass a built-in "
        "workload name, or 'package.module:factory' (a function returning the model) with "
        "batches='package.module:function', or the model together with factory=... (its state "
        "dict is saved and loaded into the factory's model on every rank)"
    )
    if isinstance(model, Workload):
        if model.name not in WORKLOADS:
            raise ValueError(f"model: workload {model.name!r} is not built in; {how}")
        model, preset = model.name, model.preset
    if isinstance(model, str) and ":" not in model:
        wl = get_workload(model, preset)
        if batches is not None:
            raise ValueError("batches: must be None with a built-in workload (it brings its own)")
        where = f"workload {wl.name!r} at preset {wl.preset!r}"
        check_divisible(wl.info["batch_size"], req.nproc, where, req.nnodes)
        return {"workload": wl.name, "preset": wl.preset}, None
    spec: dict[str, Any]
    if isinstance(model, str):
        spec = {"factory": model}
    elif isinstance(model, nn.Module):
        if factory is None:
            raise ValueError(f"model: {type(model).__name__} given without factory; {how}")
        path = run_dir / "model_state.pt"
        torch.save(model.state_dict(), path)
        spec = {"factory": factory, "state_dict": str(path)}
    else:
        raise ValueError(f"model: invalid value of type {type(model).__name__}; {how}")
    import_path(spec["factory"])  # importable here, so most likely on the workers too
    if not isinstance(batches, str):
        raise ValueError(
            f"batches: invalid value of type {type(batches).__name__} for a factory model; "
            "allowed: 'package.module:function' returning the global batches (an iterable or "
            "a callable taking the microbatch index)"
        )
    first = BatchSource(import_path(batches)()).get(0)
    check_divisible(batch_samples(first), req.nproc, f"the first batch of {batches!r}", req.nnodes)
    return spec, batches


def plan_spec(plan: DistributedPlan) -> dict[str, Any]:
    """What a rank needs of a resolved plan to wrap its model (strategy, backend, dtypes, hook)."""
    keys = ("strategy", "backend", "param_dtype", "reduce_dtype", "output_dtype", "comm_hook")
    spec = {k: getattr(plan, k) for k in keys}
    return {**spec, "count_collectives": plan.request.count_collectives}


def write_spec(
    model: nn.Module | Workload | str,
    batches: Any = None,
    *,
    distributed: Distributed | None = None,
    preset: str = "tiny",
    device: Any = "auto",
    precision: PrecisionConfig | str | None = None,
    optimizer: OptimizerConfig | None = None,
    train: Any = None,
    factory: str | None = None,
    loss_fn: str | None = None,
    run_dir: str | Path | None = None,
    **train_options: Any,
) -> tuple[DistributedPlan, Path]:
    """Resolve and check a run, write the workers' ``spec.json`` to ``run_dir`` (a new temporary
    folder by default) and return the plan and that file's path; nothing is started.

    ``fit_distributed`` starts torchrun on it; for several nodes, run
    ``torchrun ... -m precision_nb.engine.distributed.worker SPEC`` on each (docs/distributed.md).
    """
    request = RunRequest.of(
        model, batches, preset=preset, device=device, precision=precision,
        optimizer=optimizer, train=train, loss_fn=loss_fn, **train_options,
    )  # fmt: skip
    return write_request_spec(request, distributed, factory=factory, run_dir=run_dir)


def write_request_spec(
    request: RunRequest,
    distributed: Distributed | None = None,
    *,
    factory: str | None = None,
    run_dir: str | Path | None = None,
) -> tuple[DistributedPlan, Path]:
    """:func:`write_spec` for a request already checked (``RunRequest.of``)."""
    req = distributed if distributed is not None else Distributed()
    loss_fn = request.loss_fn
    if loss_fn is not None and not isinstance(loss_fn, str):
        raise ValueError(
            f"loss_fn: invalid value of type {type(loss_fn).__name__}; allowed: None or "
            "'package.module:function' (a function object cannot be sent to torchrun workers)"
        )
    if loss_fn is not None:
        import_path(loss_fn)
    cfg = request.train
    if cfg.inspect:
        raise ValueError(
            "train.inspect: invalid value True with a distributed run; allowed: False (a model "
            "wrapped for several processes is not inspected: inspect the single-process model "
            "with precision_nb.inspect, or fit without distributed)"
        )
    prec, opt, device = request.precision, request.optimizer, request.device
    plan = explain_distributed(req, prec, device, optimizer=opt)  # RuntimeError before start
    fresh = run_dir is None
    folder = Path(tempfile.mkdtemp(prefix="precision_nb_dist_")) if fresh else Path(run_dir)
    folder = folder.expanduser().resolve()  # the ranks (and other nodes) read it from elsewhere
    folder.mkdir(parents=True, exist_ok=True)
    earlier = sorted(p.name for p in folder.glob("rank*.jsonl"))
    if earlier:  # no rank of a new run starts before every node has written its run file
        raise ValueError(
            f"run_dir: invalid value {str(folder)!r}: it holds the rank logs of an earlier run "
            f"({', '.join(earlier[:3])}{', ...' if len(earlier) > 3 else ''}); allowed: a new or "
            "empty folder (gather that run first: precision-nb gather RUN_DIR)"
        )
    try:
        model_spec, batches_path = _model_spec(
            request.model, request.batches, request.preset, factory, folder, req
        )
    except BaseException:
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    spec = {
        "run_dir": str(folder),
        "model": model_spec,
        "batches": batches_path,
        "loss_fn": loss_fn,
        "device": plan.device_type,
        "timeout_s": req.timeout_s,
        "precision": prec.to_dict(),
        "optimizer": opt.to_dict(),
        "train": asdict(cfg),
        "plan": plan_spec(plan),
        "nodes": run_nodes(req),
        # what the plan was resolved from, so that gather can resolve it again on a machine
        # without the nodes' devices
        "resolved": {
            "request": plan.request.to_dict(),
            "device": str(device),
            "capabilities": plan.precision.capabilities.to_dict(),
        },
    }
    # a temporary file and a rename: a rank on another node reading the shared run file sees
    # the old file or the new one, never half
    spec_path, tmp = folder / "spec.json", folder / f".spec.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(spec), encoding="utf-8")
    os.replace(tmp, spec_path)
    return plan, spec_path


def fit_distributed(
    model: nn.Module | Workload | str,
    batches: Any = None,
    *,
    distributed: Distributed | None = None,
    preset: str = "tiny",
    device: Any = "auto",
    precision: PrecisionConfig | str | None = None,
    optimizer: OptimizerConfig | None = None,
    train: Any = None,
    factory: str | None = None,
    loss_fn: str | None = None,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    run_dir: str | Path | None = None,
    **train_options: Any,
) -> DistributedResult:
    """Train on ``distributed.nproc`` processes launched by torchrun; see the module docstring.

    ``model``: a built-in workload (name or :class:`Workload`, with ``preset``), a
    ``"package.module:factory"`` path (with ``batches="package.module:function"``), or an
    ``nn.Module`` with ``factory=`` (its state dict travels in a file); ``loss_fn`` likewise as
    ``"package.module:function"``. Every batch is a global
    batch; each rank trains its 1/nproc slice. ``callbacks`` get rank 0's records live
    (``on_log(record)``) and ``on_fit_end(result)``. Raises :class:`DistributedError` (every
    rank's records kept, the failing rank's error in the message) when a rank fails; an error
    of a callback is raised as itself, every rank ended and their records on it as ``.result``.

    ``run_dir``: the folder of the run file and the ranks' logs; None (a temporary folder,
    removed afterwards) or a folder that is kept (``gather`` reads it again later). With
    ``distributed.nnodes > 1`` the launcher starts one torchrun agent per node here, or only node
    ``distributed.node_rank`` (the other nodes start theirs with the same run file: give a
    ``run_dir`` every node can read and write, and the result holds every node's ranks).
    """
    request = RunRequest.of(
        model, batches, preset=preset, device=device, precision=precision,
        optimizer=optimizer, train=train, loss_fn=loss_fn, **train_options,
    )  # fmt: skip
    return launch(
        request, distributed, factory=factory, callbacks=callbacks, stop=stop, run_dir=run_dir
    )


def launch(
    request: RunRequest,
    distributed: Distributed | None = None,
    *,
    factory: str | None = None,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    run_dir: str | Path | None = None,
) -> DistributedResult:
    """:func:`fit_distributed` for a request already checked (``RunRequest.of``)."""
    true = [p.label for p in request.precisions if p.weights == "true"]
    if true:  # refused before anything starts, not half-run on the ranks
        raise ValueError(
            f"precision: invalid value {true[0]!r} with distributed=...: true plans train on one "
            "process; allowed: a mixed plan (fp32, bf16, fp16) for a distributed run"
        )
    dispatch = Callbacks(callbacks)
    plan, spec_path = write_request_spec(request, distributed, factory=factory, run_dir=run_dir)
    return _launch(plan, spec_path, dispatch, stop, keep=run_dir is not None)


def _launch(
    plan: Any, spec_path: Path, callbacks: Callbacks, stop: Any, *, keep: bool
) -> DistributedResult:
    run_dir = spec_path.parent
    follow = Rank0Follower(callbacks, run_dir)
    try:
        try:
            run = run_torchrun(plan.request, spec_path, run_dir, stop, follow)
        except BaseException as exc:  # a callback of yours raised (or a start failed); ranks ended
            ranks = read_ranks(run_dir)
            partial = DistributedResult(
                plan, ranks, merge_records(ranks), stopped=True, run_dir=str(run_dir)
            )
            attach_result(exc, partial)
            raise
        ranks = read_ranks(run_dir)
        if run.stopped:
            stopped_not_failed(ranks)
        result = run.result(plan, ranks)
        if run.failed(ranks):
            raise failure(result, run)  # reads the nodes' markers in run_dir
        if result.missing_ranks:
            log.warning(
                "ranks %s left no log in %s (another node's folder?): the merged records average "
                "the %d rank(s) here only; give every node one shared run_dir",
                result.missing_ranks,
                run_dir,
                len(ranks),
            )
        try:
            callbacks.fit_end(result)
        except BaseException as exc:
            attach_result(exc, result)
            raise
    finally:
        if not keep:  # records and log tail of a failure are in its error
            shutil.rmtree(run_dir, ignore_errors=True)
    return result


class Rank0Follower:
    """The ``poll()`` of a launch: rank 0's lines written since the last call to the callbacks
    (``on_log(record)``; ``on_phase(text)`` for a measured run's phases)."""

    def __init__(self, callbacks: Callbacks, run_dir: Path) -> None:
        self.path, self.callbacks, self.seen = run_dir / "rank0.jsonl", callbacks, 0
        self.wanted = callbacks.wants("on_log") or callbacks.wants("on_phase")

    def __call__(self) -> None:
        if not self.wanted or not self.path.exists():
            return
        items = rank_lines(self.path)
        for item in items[self.seen :]:
            kind = item.get("kind")
            if kind == "record":
                self.callbacks.log(item["record"])
            elif kind == "phase":
                self.callbacks.phase(str(item.get("text", "")))
        self.seen = len(items)
