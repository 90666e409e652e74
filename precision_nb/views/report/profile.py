"""``profile()``: one run request, measured by the engine, returned as a :class:`Profile`.

``profile("mlp", preset="small")`` or ``profile(my_model, my_batches)``. Its arguments become one
:class:`~precision_nb.engine.request.RunRequest` (:func:`profile_request`: the profile's defaults,
checked once, before anything runs); the engine measures it (:func:`~precision_nb.engine.compare.
run_comparison`, or one torchrun launch for a distributed request) and analyses it
(:func:`~precision_nb.engine.analyses.analyse`); ``Profile.save(path)`` (or ``out=``) then writes
the folder ``precision-nb profile`` writes, atomically.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from precision_nb.core.defaults import (
    DEFAULT_ALLOCATOR,
    DEFAULT_BUDGET_S,
    DEFAULT_COMPARE,
    DEFAULT_PRESET,
    DEFAULT_PROCESSES,
    DEFAULT_STEPS,
    DEFAULT_TARGET,
    DEFAULT_WARMUP_MAX,
    DEFAULT_WORKLOAD,
    PROFILE_POINTS,
)
from precision_nb.views.report import folder
from precision_nb.views.report.folder import ReportWriteError, check_output_folder
from precision_nb.views.report.hints import hints
from precision_nb.views.report.numerics import Numerics
from precision_nb.views.report.profile_result import Profile, measurement_settings
from precision_nb.views.report.tables import summary

__all__ = [
    "Profile",
    "ProfileInterrupted",
    "ReportWriteError",
    "check_output_folder",
    "output_folder",
    "profile",
    "profile_request",
    "run_profile",
]

log = logging.getLogger(__name__)


def profile_request(
    model: Any = None,
    batches: Any = None,
    loss_fn: Any = None,
    compare: str | Sequence[Any] = DEFAULT_COMPARE,
    *,
    preset: str | None = None,
    device: str = "auto",
    steps: int | None = None,
    rounds: int | None = None,
    accumulation: int = 1,
    fused: bool | None = None,
    loss_scale_lab: bool = False,
    progress: bool = True,
    inspect: bool = True,
    numerics: bool = True,
    distributed: Any = None,
    processes: int | None = DEFAULT_PROCESSES,
    target: float | None = DEFAULT_TARGET,
    budget_s: float | None = DEFAULT_BUDGET_S,
    rebuild: tuple[str, str] | None = None,
    compile: Any = "off",
    time_split: bool = True,
    allocator: str = DEFAULT_ALLOCATOR,
) -> Any:
    """The :class:`~precision_nb.engine.request.RunRequest` of a profile, with the profile's
    defaults (:mod:`precision_nb.core.defaults`), checked (:meth:`RunRequest.check`); the
    arguments are :func:`profile`'s (``model`` None: the default workload). A distributed profile
    is one torchrun launch: its interval covers the rounds of that launch (the launch is its one
    process level), so it gets neither processes nor a budget.
    """
    from precision_nb.core import validate
    from precision_nb.core.optim import OptimizerConfig
    from precision_nb.engine.measure_config import MeasureConfig
    from precision_nb.engine.request import RunRequest

    wanted = (("inspect", inspect), ("numerics", numerics), ("time_split", time_split))
    for name, on in wanted:
        validate.boolean(name, on)
    analyses = [name for name, on in wanted if on]
    steps = DEFAULT_STEPS if steps is None else steps
    if processes is not None and budget_s is DEFAULT_BUDGET_S:
        budget_s = None  # processes=N asked for: exactly N; the default budget is the target's
    measure = MeasureConfig(
        rounds=rounds,
        warmup_max=DEFAULT_WARMUP_MAX,
        allocator=allocator,
        **(
            {}
            if distributed is not None
            else {
                "processes": processes,
                "target": target,
                "budget_s": budget_s,
                "rebuild": rebuild,
                # the default budget limits the fresh processes; only a budget asked for is
                # refused when a single round does not fit in it
                "refuse_small_budget": budget_s is not DEFAULT_BUDGET_S,
            }
        ),
    )
    request = RunRequest.of(
        DEFAULT_WORKLOAD if model is None else model, batches,
        preset=DEFAULT_PRESET if preset is None else str(preset).strip().lower(), device=device,
        precision=compare, loss_scale_lab=loss_scale_lab, optimizer=OptimizerConfig(fused=fused),
        loss_fn=loss_fn, compile=compile, measure=measure, analyses=analyses,
        distributed=distributed, steps=steps, accumulation=accumulation, progress=progress,
        log_every=max(1, steps // PROFILE_POINTS) if isinstance(steps, int) else 1,
    )  # fmt: skip
    request.check()
    if distributed is not None:  # resolved on torchrun's ranks now, not after a warm-up
        from precision_nb.engine.distributed.measured import distributed_plans

        distributed_plans(request)
    return request


def output_folder(out: str | Path | None) -> Path | None:
    """``out`` as a checked report folder (None: nothing is written until ``save``)."""
    if out is None:
        return None
    path = Path(out).expanduser()
    check_output_folder(path)
    return path


def profile(
    model: Any = None,
    batches: Any = None,
    loss_fn: Any = None,
    compare: str | Sequence[str] = DEFAULT_COMPARE,
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
    time_split: bool = True,
    allocator: str = DEFAULT_ALLOCATOR,
) -> Profile:
    """Measure the ``compare`` plans on ``model`` (an ``nn.Module`` with ``batches``, or a
    built-in workload name with ``preset``) and return a :class:`Profile`.

    ``steps`` measured steps per plan (default :data:`DEFAULT_STEPS`) split over ``rounds``
    interleaved rounds (default :data:`DEFAULT_ROUNDS`, fewer only when fewer steps are measured;
    more rounds than steps are refused), after a warm-up per plan. Everything is checked first
    (``ValueError`` / ``RuntimeError``, nothing run or written). ``out``: also write the report
    folder there (as ``Profile.save``). ``workload`` / ``modes`` are the keyword spellings of
    ``model`` / ``compare``. ``inspect`` / ``numerics``: also inspect each plan (memory by kind
    and dtype, op dtypes) and analyse gradient underflow, after the timed steps
    (``Profile.inspections``, ``Profile.numerics``). ``time_split``: after the timed steps, a few
    profiled steps per plan split its step time by op family, set against the baseline's
    (``Profile.time_split``, ``time_by_family.csv``). ``distributed``: a ``Distributed`` request;
    all plans then run in one torchrun launch, measured the same way (warm-up agreed over the
    ranks, the slowest rank per step; see docs/distributed.md).

    ``processes`` / ``target`` / ``budget_s``: how long to measure. By default fresh processes
    are added (a model object travels to them by value; one that cannot is measured in this
    process only, which the verdict says) until every speedup's interval over processes is
    within ``target`` (±5 %) or ``budget_s`` (40 s) is spent; ``processes=N`` measures in
    exactly N processes (the default budget does not cut them short; a budget other than the
    default does), ``processes=1`` in this one only. The verdicts say which rule stopped the
    measurement and what the interval covers. ``allocator``: "settled" (glibc malloc's thresholds
    set alike in every measuring process, as a long-running process settles them) or "as-is"
    (see :mod:`precision_nb.engine.allocator`); the report's method says which.

    ``compile``: "off" (eager, the default), a torch.compile mode, or several (``"off,default"``
    or a sequence): every precision is measured under every mode (``bf16``, ``bf16+compile``),
    the compile step apart from every step time, and the report adds a torch.compile section
    (compile time, pay-back, speed against eager, agreement, graph breaks).
    """
    try:
        request = profile_request(
            workload if model is None else model, batches, loss_fn,
            compare if modes is None else modes, preset=preset, device=device, steps=steps,
            rounds=rounds, accumulation=accumulation, fused=fused, loss_scale_lab=loss_scale_lab,
            progress=progress, inspect=inspect, numerics=numerics, distributed=distributed,
            processes=processes, target=target, budget_s=budget_s, compile=compile,
            time_split=time_split, allocator=allocator,
        )  # fmt: skip
    except ValueError as err:
        raise _as_argument(err) from err
    return run_profile(request, out=output_folder(out), settings=settings)


#: The request's field names -> the argument of :func:`profile` that sets them.
ARGUMENT_NAMES = (
    ("precision:", "compare:"),
    ("optimizer.fused:", "fused:"),
    ("measure.allocator:", "allocator:"),
)


def _as_argument(err: ValueError) -> ValueError:
    """``err`` naming the argument of :func:`profile` the user passed, not the request field
    it became (``compare: invalid value ...``, not ``precision: ...``)."""
    text = str(err)
    for field, argument in ARGUMENT_NAMES:
        if text.startswith(field):
            return ValueError(argument + text[len(field) :])
    return err


class ProfileInterrupted(KeyboardInterrupt):
    """The profile was interrupted (Ctrl-C or ``stop``); the output folder was left as it was."""


def run_profile(
    request: Any,
    *,
    out: Path | None = None,
    settings: Mapping[str, Any] | None = None,
    stop: Any = None,
    wording: Callable[[str], str] | None = None,
) -> Profile:
    """Run a checked request (:func:`profile_request`): measure, analyse, then write its folder
    when ``out`` is set (:meth:`Profile.save`); ``wording``: see :func:`~.html.report_files`.

    ``stop`` (anything with ``is_set()``) ends the comparison between steps. With an output
    folder, a stop (or Ctrl-C) at any point before the report is in place raises
    :class:`ProfileInterrupted` or ``WriteInterrupted`` and leaves the folder as it was; a
    staging folder a killed run left there is removed first.
    """
    from precision_nb.engine.analyses import analyse

    if out is not None and out.is_dir():
        folder.remove_stale(out)
    runs: dict[str, Any] = {}
    if request.distributed is not None:
        from precision_nb.engine.distributed.measured import compare_distributed

        comparison, runs = compare_distributed(request, stop=stop)
    else:
        comparison = _measure(request, stop)
    _check_stop(out, comparison.stopped)
    hint_list = tuple(hints(comparison))
    shown = {
        "requested plans": ", ".join(dict.fromkeys(p.requested for p in request.precisions)),
        "device requested": str(request.device),
        "gradient accumulation": request.train.accumulation,
        "fused AdamW": {None: "auto (probe)", True: "true", False: "false"}[
            request.optimizer.fused
        ],
        "loss-scale lab": any(p.loss_scale_lab for p in request.precisions),
        "torch.compile": ", ".join(request.compiles),
        **(settings or {}),
    }
    if runs:
        shown["distributed"] = "; ".join(f"{k}: {v.plan.summary()}" for k, v in runs.items())
    extras = analyse(request, comparison)
    comparison.events.extend(extras.events)
    comparison.attach_inspections(extras.inspections)
    for name, seconds in extras.seconds.items():
        shown[f"{name} (after the timed steps)"] = f"{seconds:.1f} s"
    if comparison.time_split is not None and comparison.time_split.seconds:
        shown["time split (after the timed steps)"] = f"{comparison.time_split.seconds:.1f} s"
    shown.update(measurement_settings(comparison, hint_list))
    result = Profile(
        comparison,
        summary(comparison),
        hint_list,
        shown,
        inspections=dict(extras.inspections),
        numerics=None if extras.numerics is None else Numerics(extras.numerics, extras.scaled),
        distributed=runs,
        wording=wording,
    )
    _check_stop(out, stop is not None and stop.is_set())
    if out is not None:
        result.save(out, stop=stop)
    return result


def _check_stop(out: Path | None, stopped: bool) -> None:
    if stopped and out is not None:
        raise ProfileInterrupted(f"interrupted; {str(out)!r} was left as it was")


def _measure(request: Any, stop: Any) -> Any:
    """The engine's comparison of ``request``. When a plan fails part-way and another completed,
    the comparison is returned with its failures (the report shows the completed rounds);
    otherwise the failure is raised."""
    from precision_nb.engine.compare import Comparison, run_comparison
    from precision_nb.engine.results import partial_result

    try:
        return run_comparison(request, stop=stop)
    except Exception as exc:  # a plan's failure carries the comparison; anything else goes on
        comparison = partial_result(exc)
        if not isinstance(comparison, Comparison):
            raise
        failed = comparison.failures
        if not [k for k in comparison.results if k not in failed]:
            raise
        log.warning("plan(s) %s failed part-way: %r", ", ".join(failed), exc)
        return comparison
