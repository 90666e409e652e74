"""``fit_distributed``: start the ranks with ``torchrun`` (a subprocess), follow rank 0 live and
gather every rank's records.

The calling process (a notebook kernel, a script, the CLI) is the launcher, never a rank. It picks a
free port on the rendezvous host (loopback by default), runs torchrun (its stores bound to that
host, see :mod:`~precision_nb.engine.distributed.process`) with ``--max-restarts 0``, reads the
ranks' JSON-line logs while they train (rank 0's records go to the callbacks as they are logged),
and at the end makes sure no worker outlives the run: torchrun is stopped with SIGTERM (which it
forwards), then its process group and any worker it recorded are killed by id.
"""

from __future__ import annotations

import json
import logging
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
from precision_nb.engine.distributed.parallel import batch_samples, check_divisible
from precision_nb.engine.distributed.process import (
    exit_codes,
    failure,
    free_port,
    root_cause,
    run_torchrun,
    stopped_not_failed,
)
from precision_nb.engine.distributed.rank import import_path
from precision_nb.engine.distributed.results import DistributedResult, read_rank_log
from precision_nb.engine.request import RunRequest
from precision_nb.engine.workloads import WORKLOADS, Workload, get_workload

__all__ = [
    "exit_codes",
    "fit_distributed",
    "free_port",
    "launch",
    "plan_spec",
    "root_cause",
    "write_request_spec",
    "write_spec",
]

log = logging.getLogger(__name__)
#: The earlier private name of :func:`~precision_nb.engine.distributed.process.stopped_not_failed`.
_stopped_not_failed = stopped_not_failed


def _model_spec(
    model: Any, batches: Any, preset: str, factory: str | None, run_dir: Path, nproc: int
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
        check_divisible(
            wl.info["batch_size"], nproc, f"workload {wl.name!r} at preset {wl.preset!r}"
        )
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
    check_divisible(batch_samples(first), nproc, f"the first batch of {batches!r}")
    return spec, batches


def plan_spec(plan: DistributedPlan) -> dict[str, Any]:
    """What a rank needs of a resolved plan to wrap its model (strategy, backend, dtypes, hook)."""
    return {
        "strategy": plan.strategy,
        "backend": plan.backend,
        "param_dtype": plan.param_dtype,
        "reduce_dtype": plan.reduce_dtype,
        "output_dtype": plan.output_dtype,
        "comm_hook": plan.comm_hook,
        "count_collectives": plan.request.count_collectives,
    }


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
    folder.mkdir(parents=True, exist_ok=True)
    try:
        model_spec, batches_path = _model_spec(
            request.model, request.batches, request.preset, factory, folder, req.nproc
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
    }
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
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
    **train_options: Any,
) -> DistributedResult:
    """Train on ``distributed.nproc`` processes launched by torchrun; see the module docstring.

    ``model``: a built-in workload (name or :class:`Workload`, with ``preset``), a
    ``"package.module:factory"`` path (with ``batches="package.module:function"``), or an
    ``nn.Module`` with ``factory=`` (its state dict travels in a file); ``loss_fn`` likewise as
    ``"package.module:function"``. Every batch is a global
    batch; each rank trains its 1/nproc slice. ``callbacks`` get rank 0's records live
    (``on_log(record)``) and ``on_fit_end(result)``. Raises :class:`DistributedError` (every
    rank's records kept, the failing rank's error in the message) when a rank fails.
    """
    request = RunRequest.of(
        model, batches, preset=preset, device=device, precision=precision,
        optimizer=optimizer, train=train, loss_fn=loss_fn, **train_options,
    )  # fmt: skip
    return launch(request, distributed, factory=factory, callbacks=callbacks, stop=stop)


def launch(
    request: RunRequest,
    distributed: Distributed | None = None,
    *,
    factory: str | None = None,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
) -> DistributedResult:
    """:func:`fit_distributed` for a request already checked (``RunRequest.of``)."""
    dispatch = Callbacks(callbacks)
    plan, spec_path = write_request_spec(request, distributed, factory=factory)
    return _launch(plan, spec_path, spec_path.parent, dispatch, stop)


def _launch(
    plan: Any, spec_path: Path, run_dir: Path, callbacks: Callbacks, stop: Any
) -> DistributedResult:
    rank0 = run_dir / "rank0.jsonl"
    seen = [0]

    def follow() -> None:
        seen[0] = _follow(rank0, seen[0], callbacks)

    run = run_torchrun(plan.request, spec_path, run_dir, stop, follow)
    ranks = [read_rank_log(run_dir / f"rank{r}.jsonl", r) for r in range(plan.request.nproc)]
    if run.stopped:
        stopped_not_failed(ranks)
    result = run.result(plan, ranks)
    if run.failed(ranks):
        shutil.rmtree(run_dir, ignore_errors=True)  # records and log tail are in the error
        raise failure(result, run.log_text, run.returncode)
    callbacks.fit_end(result)
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _follow(path: Path, seen: int, callbacks: Callbacks) -> int:
    """Hand rank 0's records logged since the last call to the callbacks; returns the count."""
    if not callbacks.wants("on_log") or not path.exists():
        return seen
    records = read_rank_log(path, 0).records
    for rec in records[seen:]:
        callbacks.log(rec)
    return len(records)
