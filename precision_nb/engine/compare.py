"""compare(): several precision plans on one workload, same initial weights and data order.

Each request is resolved first (:mod:`precision_nb.engine.planning`); what compiling cost and
changed is in ``.compiled`` (:mod:`precision_nb.engine.compile.comparing`). The plans are
measured as :mod:`precision_nb.engine.measure` describes; each plan trains exactly as a single
``fit`` of ``steps`` steps would. Drift is measured against the (eager) fp32 run: the final-loss
difference and the relative L2 difference of all trainable parameters.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from precision_nb.core import validate
from precision_nb.core.events import Event
from precision_nb.core.optim import OptimizerConfig
from precision_nb.engine import allocator
from precision_nb.engine.callbacks import Callbacks
from precision_nb.engine.comparison import Comparison, Drift, plan_outcomes
from precision_nb.engine.compile import comparing
from precision_nb.engine.measure_config import MeasureConfig
from precision_nb.engine.measure_processes import measure as measure_in_processes
from precision_nb.engine.measure_processes import rebuild_spec, trainer_sessions
from precision_nb.engine.metrics import compute_dtype, peak_ratios
from precision_nb.engine.planning import Planning, plan_runs
from precision_nb.engine.request import RunRequest
from precision_nb.engine.results import RunResult, attach_result, partial_result
from precision_nb.engine.time_split import split_comparison
from precision_nb.engine.time_split.pool import PROCESS_SPLIT
from precision_nb.engine.train_config import TrainConfig
from precision_nb.engine.trainer import Trainer
from precision_nb.engine.workloads import DEFAULT_WORKLOAD, Workload

__all__ = ["Comparison", "compare", "run_comparison"]

log = logging.getLogger(__name__)


def compare(
    modes: Sequence[Any] = ("fp32", "bf16", "fp16"),
    workload: str | Workload = DEFAULT_WORKLOAD,
    preset: str = "tiny",
    *,
    model: nn.Module | None = None,
    batches: Any = None,
    device: Any = "auto",
    optimizer: OptimizerConfig | None = None,
    train: TrainConfig | None = None,
    loss_scale_lab: bool = False,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    measure: MeasureConfig | None = None,
    compile: Any = "off",
    time_split: bool = False,
    **train_options: Any,
) -> Comparison:
    """Train each requested precision on identical weights and data; see module docstring.

    ``modes``: mode strings or :class:`PrecisionConfig` values. ``loss_scale_lab=True`` turns a
    plain "fp16" request into the CPU loss-scale lab. With ``model`` (and ``batches``) your own
    model is copied for every run; otherwise the built-in ``workload`` at ``preset`` is used.
    ``loss_fn`` is passed to every run's :class:`Trainer`, as in ``fit()``. ``measure`` sets
    the warm-up rule, the rounds and the processes (:class:`MeasureConfig`: this process only by
    default; see :mod:`precision_nb.engine.measure_processes`); ``steps`` (a TrainConfig field) is
    the number of measured steps per plan, split over the rounds. When a plan fails, the others
    still finish; then the first plan's failure is raised as it was (your own error keeps its
    type and traceback) with the whole comparison as ``.result`` (``failures`` says which plans
    stopped where). ``compile``: one mode or several ("off", "default", "reduce-overhead",
    "max-autotune"); every precision is measured under every mode. ``time_split``: after the
    timed rounds, a few profiled steps per plan split its step time by op family
    (``Comparison.time_split``; :mod:`precision_nb.engine.time_split`).
    """
    if model is not None and batches is None:
        raise ValueError("batches is None; pass batches together with your own model")
    request = RunRequest.of(
        model if model is not None else workload, batches, preset=preset, device=device,
        precision=modes, loss_scale_lab=loss_scale_lab, optimizer=optimizer, train=train,
        loss_fn=loss_fn, compile=compile, measure=measure,
        analyses=("time_split",) if validate.boolean("time_split", time_split) else (),
        **train_options,
    )  # fmt: skip
    return run_comparison(request, callbacks=callbacks, stop=stop)


def run_comparison(
    request: RunRequest,
    *,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    measure: MeasureConfig | None = None,
    planning: Planning | None = None,
) -> Comparison:
    """:func:`compare` for a checked request: every plan of ``request`` on the same weights and
    data, measured as ``request.measure`` says (``measure`` replaces it). ``planning``: the
    request's :class:`~precision_nb.engine.planning.Planning` when the caller made it already."""
    if measure is not None:
        request = request.replace(measure=measure)
    cfg, device = request.train, request.device
    optimizer, loss_fn = request.optimizer, request.loss_fn
    dispatch = Callbacks(callbacks)
    model, batches, info = request.prepare()
    if isinstance(batches, Iterable) and iter(batches) is batches:
        raise ValueError(
            f"batches has type {type(batches).__name__}, a one-shot iterator; compare needs "
            "batches it can replay for every plan: a callable, a DataLoader or a list"
        )
    initial = copy.deepcopy(model).cpu()
    planning = planning if planning is not None else plan_runs(request)
    out = Comparison(merged=dict(planning.merged), events=list(planning.events))
    out.model_info = {
        "class": type(model).__qualname__,
        "params": sum(p.numel() for p in model.parameters()),
    }
    breaks, untraceable = comparing.check_breaks(
        planning.explanations, initial, batches, loss_fn, out.events
    )
    planning = planning.without(untraceable)
    mcfg = request.measure
    trainers: dict[str, Trainer] = {}
    warm_trainers: dict[str, Trainer] = {}
    precisions, compiles = planning.precisions, planning.compiles
    make_session = trainer_sessions(
        initial, batches, device=device, plans=precisions, optimizer=optimizer, train=cfg,
        loss_fn=loss_fn, info=info, callbacks=dispatch, stop=stop, trainers=trainers,
        compiles=compiles, warm_trainers=warm_trainers,
    )  # fmt: skip
    user_model = isinstance(request.model, nn.Module)
    rebuild, single_reason = rebuild_spec(
        workload=None if user_model else request.model, preset=request.preset,
        user_model=user_model, batches=request.batches, loss_fn=loss_fn, device=device,
        train=cfg, optimizer=optimizer, plans=precisions, initial=initial, model_spec=mcfg.rebuild,
        compiles=compiles,
    )  # fmt: skip
    if rebuild is not None and "time_split" in request.analyses:  # each fresh process splits too,
        # with heap faulted in ahead where the allocator is settled (as this process's split)
        heap = allocator.RESERVE if allocator.settle(mcfg.allocator)[0] else 0
        split = dataclasses.replace(PROCESS_SPLIT, heap_ahead=heap)
        rebuild = dataclasses.replace(rebuild, time_split=dataclasses.asdict(split))
    baseline = planning.baseline
    measurement, sessions, failures = measure_in_processes(
        planning.specs, make_session, cfg.steps, mcfg, rebuild=rebuild,
        single_reason=single_reason, baseline=baseline, stop=stop, on_warmup=dispatch.warmup,
        callbacks=dispatch, progress=cfg.progress,
    )  # fmt: skip
    out.measurement = measurement
    out.events.extend(measurement.events)
    params: dict[str, torch.Tensor] = {}
    for label, session in sessions.items():
        failure = failures.get(label)
        partial = partial_result(failure)
        result = partial if isinstance(partial, RunResult) else session.result
        if failure is None:
            result = session.finish()
        out.results[label] = result
        out.events.extend(e.prefixed(label) for e in result.events)
        weights = trainers[label].model.parameters()
        params[label] = torch.cat([p.detach().float().cpu().reshape(-1) for p in weights])
        out.stopped = out.stopped or bool(result.stopped or measurement.stopped)
    compiled, more = comparing.collect(
        planning.explanations, measurement, out.results, trainers, warm_trainers, breaks
    )
    out.events.extend(more)
    ref = out.baseline = _reference(out.results, failures, baseline)
    if ref is None:
        out.events.append(Event("warning", "no fp32 run among the requests: drift is None"))
    drift = {label: _drift(out.results, params, label, ref) for label in out.results}
    out.outcomes, more = plan_outcomes(
        measurement, out.results, ref, drift=drift, compiled=compiled
    )
    out.events.extend(more)
    if "time_split" in request.analyses:  # after the timed rounds, on the plans' own trainers
        out.events.extend(split_comparison(out, trainers, failures))
    out.method = measurement.method()
    if cfg.measure_peak:
        dtypes = tuple({compute_dtype(r.plan) for r in out.results.values()} - {torch.float32})
        first = next(iter(out.results.values()), None)
        if first is not None and dtypes:
            out.peak_ratios = peak_ratios(torch.device(first.device), dtypes)
    if failures:  # loud, after the other plans finished: the first failure as it was raised
        label, first_failure = next(iter(failures.items()))
        where = f"plan {label} of the comparison failed with this error (every failed plan: "
        raise attach_result(first_failure, out, where + "`.result.failures`); ")
    return out


def _reference(
    results: dict[str, RunResult], failures: dict[str, BaseException], baseline: str | None
) -> str | None:
    """The fp32 run drift is measured against: the baseline, else the first fp32 run that
    finished."""
    done = [k for k, r in results.items() if r.plan.mode == "fp32" and k not in failures]
    return baseline if baseline in done else next(iter(done), None)


def _drift(
    results: dict[str, RunResult], params: dict[str, torch.Tensor], label: str, ref: str | None
) -> Drift:
    """Final-loss difference and relative L2 distance of the weights from the ``ref`` run."""
    if ref is None:
        return Drift()
    loss, ref_loss = results[label].final_loss, results[ref].final_loss
    reference = params[ref]
    denom = float(reference.norm()) or 1.0
    return Drift(
        None if loss is None or ref_loss is None else loss - ref_loss,
        float((params[label] - reference).norm()) / denom,
    )
