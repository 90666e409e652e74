"""``profile()``: validate a request, measure the plans, return a :class:`Profile`.

``profile("mlp", preset="small")`` or ``profile(my_model, my_batches)``. A profile computes
first (the comparison, then each plan's inspection and the numerics,
:mod:`~precision_nb.views.report.profile_compute`); ``Profile.save(path)`` (or ``out=``) then
builds the report's sections and writes the folder ``precision-nb profile`` writes, atomically
(:mod:`~precision_nb.views.report.html`, :mod:`~precision_nb.views.report.folder`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_nb.core import validate
from precision_nb.views.report import folder
from precision_nb.views.report.folder import ReportWriteError, WriteInterrupted, check_output_folder
from precision_nb.views.report.hints import hints
from precision_nb.views.report.profile_compute import analyse
from precision_nb.views.report.profile_result import Profile, measurement_settings
from precision_nb.views.report.tables import summary

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_PROCESSES",
    "DEFAULT_ROUNDS",
    "DEFAULT_STEPS",
    "DEFAULT_TARGET",
    "DEFAULT_WARMUP_MAX",
    "PROFILE_POINTS",
    "Profile",
    "ProfileInterrupted",
    "ProfileOutput",
    "ProfileRequest",
    "ReportWriteError",
    "WriteInterrupted",
    "check_output_folder",
    "parse_compiles",
    "parse_modes",
    "profile",
    "run_profile",
    "validate_request",
]

log = logging.getLogger(__name__)

#: Measured optimizer steps per plan when ``profile`` is not given ``steps`` ...
DEFAULT_STEPS = 48
#: ... split over this many interleaved rounds (``rounds``) in each process; warm-up on top.
DEFAULT_ROUNDS = 8
#: Processes measuring the plans (``processes``): None adds fresh ones until the target or the
#: budget (see :mod:`precision_nb.engine.measure_processes`); 1 measures in this process only.
DEFAULT_PROCESSES: int | None = None
#: The relative half-width every speedup interval should reach (``target``; 0.05 = ±5 %) ...
DEFAULT_TARGET = 0.05
#: ... within this many seconds of measurement (``budget_s``: warm-ups, rounds, processes).
DEFAULT_BUDGET_S = 40.0
#: Warm-up cap in steps per plan (the warm-up usually ends earlier, when step times settle).
DEFAULT_WARMUP_MAX = 15
#: About this many logged points per plan in a profile.
PROFILE_POINTS = 25


@dataclass(frozen=True)
class ProfileRequest:
    """A validated ``profile`` request (every field checked before anything runs).

    ``model`` is a user ``nn.Module`` (with ``batches`` and an optional ``loss_fn``) or None for
    the built-in ``workload`` at ``preset``. ``out`` None: nothing is written until ``save``.
    """

    workload: str
    preset: str
    modes: tuple[str, ...]
    device: str
    steps: int | None
    accumulation: int
    fused: bool | None
    loss_scale_lab: bool
    out: Path | None
    model: Any = None
    batches: Any = None
    loss_fn: Any = None
    rounds: int | None = None
    inspect: bool = True
    numerics: bool = True
    distributed: Any = None
    processes: int | None = DEFAULT_PROCESSES
    target: float | None = DEFAULT_TARGET
    budget_s: float | None = DEFAULT_BUDGET_S
    #: ``("module:factory", "module:batches")`` a model object came from (fresh processes
    #: rebuild it from them); None for a built-in workload or a model without an import path.
    rebuild: tuple[str, str] | None = None
    #: The compile modes every precision is measured under ("off": eager).
    compile: tuple[str, ...] = ("off",)


#: The earlier name of :class:`Profile` (same fields: out_dir, files, comparison, summary, hints).
ProfileOutput = Profile


def parse_modes(value: str | Sequence[str]) -> tuple[str, ...]:
    """``"fp32,bf16"`` or a sequence -> normalised, de-duplicated modes (ValueError if empty)."""
    from precision_nb.core.plan import normalize_precision

    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(item).strip() for item in items if str(item).strip()]
    if not names:
        raise ValueError(
            f"compare: invalid value {validate.short_repr(value)}: give at least one precision "
            "request, comma-separated; allowed: auto, fp32, bf16, fp16"
        )
    modes = [normalize_precision(name, field="compare", allow_auto=True) for name in names]
    return tuple(dict.fromkeys(modes))


def parse_compiles(value: Any) -> tuple[str, ...]:
    """``"off,default"``, one mode, True/False/None or a sequence -> canonical modes, each once
    (ValueError naming ``compile`` otherwise)."""
    from precision_nb.core.names import compile_list, compile_name

    if isinstance(value, str):
        return tuple(compile_list(value, "compile"))
    if isinstance(value, (list, tuple)):
        return tuple(compile_list(",".join(compile_name(v, "compile") for v in value), "compile"))
    return (compile_name(value, "compile"),)


def validate_request(
    *,
    workload: Any = None,
    preset: str | None = None,
    modes: str | Sequence[str] = ("fp32", "bf16", "fp16"),
    device: str = "auto",
    steps: int | None = None,
    accumulation: int = 1,
    fused: bool | None = None,
    loss_scale_lab: bool = False,
    out: str | Path | None = "profile-out",
    batches: Any = None,
    loss_fn: Any = None,
    rounds: int | None = None,
    inspect: bool = True,
    numerics: bool = True,
    distributed: Any = None,
    processes: int | None = DEFAULT_PROCESSES,
    target: float | None = DEFAULT_TARGET,
    budget_s: float | None = DEFAULT_BUDGET_S,
    rebuild: tuple[str, str] | None = None,
    compile: Any = "off",
) -> ProfileRequest:
    """Check every profile argument; ``ValueError`` (or ``RuntimeError`` for absent hardware).

    ``workload``: a built-in workload name (or None for the default) or your own ``nn.Module``,
    which then needs ``batches`` (checked by fetching the first batch). ``compile``: one
    torch.compile mode or several (``"off,default"``); a mode this machine cannot compile on the
    device is refused here (``RuntimeError`` naming what is missing).
    """
    compiles = parse_compiles(compile)
    from precision_nb.engine.measure import check_options

    check_options(processes, target, budget_s, rebuild)
    from precision_nb.core.device import resolve_device
    from precision_nb.engine import workloads as wl
    from precision_nb.engine.train_config import MAX_STEPS

    model = _user_model(workload, batches)
    if model is not None:
        workload = type(model).__name__
    else:
        workload = wl.DEFAULT_WORKLOAD if workload is None else workload
        wl.get_workload(workload, wl.DEFAULT_PRESET if preset is None else preset)
    preset = wl.DEFAULT_PRESET if preset is None else preset
    if steps is not None:
        validate.positive_int("steps", steps, MAX_STEPS)
    if rounds is not None:
        validate.positive_int("rounds", rounds)
    validate.positive_int("accumulation", accumulation)
    if fused is not None:
        validate.boolean("fused", fused)  # None: auto
    validate.boolean("loss_scale_lab", loss_scale_lab)
    where = resolve_device(device)  # RuntimeError for absent CUDA/MPS, ValueError for a bad one
    if compiles != ("off",):
        from precision_nb.core.compile_mode import resolve_compile

        if distributed is not None:
            raise ValueError(
                f"compile: invalid value {','.join(compiles)!r} with a distributed profile; "
                "allowed: 'off' (distributed runs train eagerly)"
            )
        for mode in compiles:  # refused now (no C++ compiler, no Triton), not after a warm-up
            resolve_compile(mode, where.type)
    validate.boolean("inspect", inspect)
    validate.boolean("numerics", numerics)
    out_path = None if out is None else Path(out).expanduser()
    if out_path is not None:
        check_output_folder(out_path)
    if distributed is not None:
        from precision_nb.views.report.profile_distributed import check_distributed

        check_distributed(
            distributed,
            model=model,
            workload=str(workload),
            preset=str(preset).strip().lower(),
            modes=parse_modes(modes),
            device=str(device),
            loss_scale_lab=bool(loss_scale_lab),
            fused=fused,
        )
    return ProfileRequest(
        workload=str(workload),
        preset=str(preset).strip().lower(),
        modes=parse_modes(modes),
        device=str(device),
        steps=None if steps is None else int(steps),
        accumulation=int(accumulation),
        fused=fused,
        loss_scale_lab=bool(loss_scale_lab),
        out=out_path,
        model=model,
        batches=batches,
        loss_fn=loss_fn,
        rounds=None if rounds is None else int(rounds),
        inspect=inspect,
        numerics=numerics,
        distributed=distributed,
        processes=processes,
        target=target,
        budget_s=budget_s,
        rebuild=None if rebuild is None else (str(rebuild[0]), str(rebuild[1])),
        compile=compiles,
    )


def _user_model(workload: Any, batches: Any) -> Any:
    """``workload`` when it is an ``nn.Module`` (its batches checked), None for a workload name."""
    from torch import nn

    from precision_nb.engine.batches import BatchSource

    if isinstance(workload, nn.Module):
        if batches is None:
            raise ValueError(
                f"batches: invalid value None for model {type(workload).__name__}; allowed: a "
                "list of batches, a DataLoader or a callable taking the microbatch index"
            )
        source = BatchSource(batches)  # ValueError for the wrong kind of source
        if source.one_shot:
            raise ValueError(
                f"batches has type {type(batches).__name__}, a one-shot iterator; profiling "
                "replays the batches for every plan: pass a list, a DataLoader or a callable"
            )
        source.get(0)  # ValueError when the first batch is not a tensor, tuple or mapping
        return workload
    if workload is not None and not isinstance(workload, str):
        raise ValueError(
            f"model: invalid value of type {type(workload).__name__}; allowed: a torch.nn.Module "
            "or a built-in workload name (mlp, transformer, cnn)"
        )
    return None


def profile(
    model: Any = None,
    batches: Any = None,
    loss_fn: Any = None,
    compare: str | Sequence[str] = ("fp32", "bf16", "fp16"),
    *,
    workload: str | None = None,
    modes: str | Sequence[str] | None = None,
    preset: str | None = None,
    device: str = "auto",
    steps: int | None = None,
    rounds: int | None = None,
    accumulation: int = 1,
    fused: bool | None = None,
    loss_scale_lab: bool = False,
    out: str | Path | None = None,
    progress: bool = True,
    settings: Mapping[str, Any] | None = None,
    inspect: bool = True,
    numerics: bool = True,
    distributed: Any = None,
    processes: int | None = DEFAULT_PROCESSES,
    target: float | None = DEFAULT_TARGET,
    budget_s: float | None = DEFAULT_BUDGET_S,
    compile: Any = "off",
) -> Profile:
    """Measure the ``compare`` plans on ``model`` (an ``nn.Module`` with ``batches``, or a
    built-in workload name with ``preset``) and return a :class:`Profile`.

    ``steps`` measured steps per plan (default :data:`DEFAULT_STEPS`) split over ``rounds``
    interleaved rounds (default :data:`DEFAULT_ROUNDS`), after a warm-up per plan. Everything is
    validated first (``ValueError`` / ``RuntimeError``, nothing run or written). ``out``: also
    write the report folder there (as ``Profile.save``). ``workload`` / ``modes`` are the
    keyword spellings of ``model`` / ``compare``. ``inspect`` / ``numerics``: also inspect each
    plan (memory by kind and dtype, op dtypes) and analyse gradient underflow, after the timed
    steps (``Profile.inspections``, ``Profile.numerics``). ``distributed``: a ``Distributed``
    request; all plans then run in one torchrun launch, measured the same way (warm-up agreed
    over the ranks, the slowest rank per step; see docs/distributed.md).

    ``processes`` / ``target`` / ``budget_s``: how long to measure. By default fresh processes
    are added (a built-in workload can be rebuilt in one; a model object cannot, and is
    measured in this process only, which the verdict says) until every speedup's interval over
    processes is within ``target`` (±5 %) or ``budget_s`` (40 s) is spent; ``processes=N``
    measures in exactly N processes, ``processes=1`` in this one only. The verdicts say which
    rule stopped the measurement and what the interval covers.

    ``compile``: "off" (eager, the default), a torch.compile mode, or several (``"off,default"``
    or a sequence): every precision is measured under every mode (``bf16``, ``bf16+compile``),
    the compile step apart from every step time, and the report adds a torch.compile section
    (compile time, pay-back, speed against eager, agreement, graph breaks).
    """
    request = validate_request(
        workload=workload if model is None else model,
        preset=preset,
        modes=compare if modes is None else modes,
        device=device,
        steps=steps,
        accumulation=accumulation,
        fused=fused,
        loss_scale_lab=loss_scale_lab,
        out=out,
        batches=batches,
        loss_fn=loss_fn,
        rounds=rounds,
        inspect=inspect,
        numerics=numerics,
        distributed=distributed,
        processes=processes,
        target=target,
        budget_s=budget_s,
        compile=compile,
    )
    return run_profile(request, progress=progress, settings=settings)


class ProfileInterrupted(KeyboardInterrupt):
    """The profile was interrupted (Ctrl-C or ``stop``); the output folder was left as it was."""


def run_profile(
    request: ProfileRequest,
    *,
    progress: bool = True,
    settings: Mapping[str, Any] | None = None,
    stop: Any = None,
    wording: Callable[[str], str] | None = None,
) -> Profile:
    """Run a validated request: compute everything, then write its folder when ``request.out``
    is set (:meth:`Profile.save`).

    ``wording`` rewrites the written report's text files for their reader (the command line
    passes its own: a flag where the library names a Python argument).

    ``stop`` (anything with ``is_set()``) ends the comparison between steps. With an output
    folder, a stop (or Ctrl-C) at any point before the report is in place raises
    :class:`ProfileInterrupted` or ``WriteInterrupted`` and leaves the folder as it was; a
    staging folder a killed run left there is removed first.
    """
    if request.out is not None and request.out.is_dir():
        folder.remove_stale(request.out)
    runs: dict[str, Any] = {}
    if request.distributed is not None:
        from precision_nb.views.report.profile_distributed import run_distributed

        steps = DEFAULT_STEPS if request.steps is None else request.steps
        comparison, runs = run_distributed(
            request,
            steps=steps,
            log_every=max(1, steps // PROFILE_POINTS),
            progress=progress,
            stop=stop,
            measure=_measure_config(request),
        )
    else:
        comparison = run_comparison(request, progress=progress, stop=stop)
    _check_stop(request, comparison.stopped)
    hint_list = tuple(hints(comparison))
    shown = {
        "requested plans": ", ".join(request.modes),
        "device requested": request.device,
        "gradient accumulation": request.accumulation,
        "fused AdamW": {None: "auto (probe)", True: "true", False: "false"}[request.fused],
        "loss-scale lab": request.loss_scale_lab,
        "torch.compile": ", ".join(request.compile),
        **(settings or {}),
    }
    if runs:
        shown["distributed"] = "; ".join(f"{k}: {v.plan.summary()}" for k, v in runs.items())
    extras = analyse(request, comparison)
    comparison.events.extend(extras.events)
    for name, seconds in extras.seconds.items():
        shown[f"{name} (after the timed steps)"] = f"{seconds:.1f} s"
    shown.update(measurement_settings(comparison, hint_list))
    result = Profile(
        comparison,
        summary(comparison),
        hint_list,
        shown,
        inspections=dict(extras.inspections),
        numerics=extras.numerics,
        distributed=runs,
        wording=wording,
    )
    _check_stop(request, stop is not None and stop.is_set())
    if request.out is not None:
        result.save(request.out, stop=stop)
    return result


def _check_stop(request: ProfileRequest, stopped: bool) -> None:
    if stopped and request.out is not None:
        raise ProfileInterrupted(f"interrupted; {str(request.out)!r} was left as it was")


def run_comparison(request: ProfileRequest, *, progress: bool = True, stop: Any = None) -> Any:
    """Call the engine's ``compare()`` for a validated request.

    Logs about 25 points per plan (``log_every``) so the figures have curves while host syncs
    stay rare. When a plan fails part-way and another completed, the comparison is returned with
    ``failures`` set (the report shows the completed rounds); otherwise the failure is raised.
    """
    from precision_nb.engine.compare import Comparison
    from precision_nb.engine.results import partial_result

    try:
        return _compare(request, progress, stop)
    except Exception as exc:  # a plan's failure carries the comparison; anything else goes on
        comparison = partial_result(exc)
        if not isinstance(comparison, Comparison):
            raise
        failed = comparison.failures
        done = [k for k in comparison.results if k not in failed]
        if not done:
            raise
        log.warning("plan(s) %s failed part-way: %r", ", ".join(failed), exc)
        return comparison


def run_request(request: ProfileRequest, *, progress: bool = True) -> Any:
    """The engine's :class:`~precision_nb.engine.request.RunRequest` of a profile: the model (or
    workload), its precision requests (fp16 through the loss-scale lab where asked), device,
    optimizer and the loop settings of the measured steps (about 25 logged points per plan)."""
    from precision_nb.core.optim import OptimizerConfig
    from precision_nb.engine.compare import precision_request
    from precision_nb.engine.request import RunRequest

    steps = DEFAULT_STEPS if request.steps is None else request.steps
    return RunRequest.of(
        request.model if request.model is not None else request.workload,
        request.batches,
        preset=request.preset,
        device=request.device,
        precision=[precision_request(m, request.loss_scale_lab) for m in request.modes],
        optimizer=OptimizerConfig(fused=request.fused),
        loss_fn=request.loss_fn,
        accumulation=request.accumulation,
        progress=progress,
        steps=steps,
        log_every=max(1, steps // PROFILE_POINTS),
        compile=request.compile,
    )


def _compare(request: ProfileRequest, progress: bool, stop: Any) -> Any:
    from precision_nb.engine import compare

    return compare.run_comparison(
        run_request(request, progress=progress), stop=stop, measure=_measure_config(request)
    )


def _measure_config(request: ProfileRequest) -> Any:
    """The measurement of a profile: rounds, the warm-up cap, processes, target and budget.

    A distributed profile is one torchrun launch: its interval covers the rounds of that launch
    (the launch is the one process level there), so it gets neither processes nor a budget.
    """
    from precision_nb.engine.measure import MeasureConfig

    rounds = DEFAULT_ROUNDS if request.rounds is None else request.rounds
    if request.distributed is not None:
        return MeasureConfig(rounds=rounds, warmup_max=DEFAULT_WARMUP_MAX)
    return MeasureConfig(
        rounds=rounds,
        warmup_max=DEFAULT_WARMUP_MAX,
        processes=request.processes,
        target=request.target,
        budget_s=request.budget_s,
        rebuild=request.rebuild,
        # the default budget limits the fresh processes; only a budget asked for is refused
        # when a single round does not fit in it
        refuse_small_budget=request.budget_s != DEFAULT_BUDGET_S,
    )
