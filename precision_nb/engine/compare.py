"""compare(): several precision plans on one workload, same initial weights and data order.

Each request is resolved first; requests that resolve to the same plan (fp16 on CPU -> fp32) are
run once, and ``.merged`` / ``.events`` say why. With ``compile=("off", "default")`` every
precision is measured eager and compiled (``bf16``, ``bf16+compile``); what compiling cost and
changed is in ``.compiled`` (:mod:`precision_nb.engine.compile.comparing`). The plans are
measured as :mod:`precision_nb.engine.measure` describes (warm-up apart, interleaved rounds);
each plan trains exactly as a single ``fit`` of ``steps`` steps would. Drift is measured against
the (eager) fp32 run: the final-loss difference and the relative L2 difference of all trainable
parameters.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precision_nb.core import validate
from precision_nb.core.events import Event
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import Explanation, explain_precision
from precision_nb.engine import stats
from precision_nb.engine.callbacks import Callbacks
from precision_nb.engine.compile import comparing
from precision_nb.engine.measure import MeasureConfig, Measurement, PlanSpec
from precision_nb.engine.measure_processes import measure as measure_in_processes
from precision_nb.engine.measure_processes import rebuild_spec, trainer_sessions
from precision_nb.engine.metrics import PeakRatio, compute_dtype, peak_ratios, tf32_state
from precision_nb.engine.peaks import CLASS_WORDS, beyond_peak, flags_text, tf32_classes
from precision_nb.engine.precision import lab_applies, run_label
from precision_nb.engine.request import RunRequest
from precision_nb.engine.results import RunResult, attach_result, partial_result
from precision_nb.engine.train_config import TrainConfig
from precision_nb.engine.trainer import Trainer
from precision_nb.engine.workloads import DEFAULT_WORKLOAD, Workload

log = logging.getLogger(__name__)


@dataclass
class Comparison:
    """Results per label, drift from fp32, merged requests and events (in run order)."""

    results: dict[str, RunResult] = field(default_factory=dict)
    drift: dict[str, dict[str, float | None]] = field(default_factory=dict)
    merged: dict[str, str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    stopped: bool = False
    #: The interleaved measurement (per-round step times, warm-ups, round orders).
    measurement: Measurement | None = None
    #: Label -> the figures of :func:`plan_figures` (median, IQR, rates, speedup, verdict).
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Label -> why a plan stopped part-way (it is reported with the rounds it completed).
    failures: dict[str, str] = field(default_factory=dict)
    #: How the figures were measured (warm-up rule, rounds, steps per block).
    method: dict[str, Any] = field(default_factory=dict)
    #: The model measured: ``class`` (qualified name) and ``params`` (parameter count).
    model_info: dict[str, Any] = field(default_factory=dict)
    #: dtype name -> its peak FLOP/s over the fp32 peak here: an estimate of the gain, not a bound.
    peak_ratios: dict[str, PeakRatio] = field(default_factory=dict)
    #: Compiled label -> its :class:`~precision_nb.engine.compile.report.CompiledPlanReport`
    #: (compile step, recompilations, speed against eager, pay-back, agreement, graph breaks).
    compiled: dict[str, Any] = field(default_factory=dict)

    @property
    def load_note(self) -> str:
        """The measurement's busy-machine note ("" when quiet or not measured)."""
        return self.measurement.load_note if self.measurement is not None else ""

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record of every run, in run order (the ``run`` key tells them apart)."""
        return [r for res in self.results.values() for r in res.records]


def _tokens_per_sample(result: RunResult) -> float | None:
    """Tokens per sample from the records (both rates share one interval, so this is exact)."""
    for record in result.records:
        tokens, samples = record.get("tokens_per_s"), record.get("samples_per_s")
        if tokens and samples:
            return float(tokens) / float(samples)
    return None


def _per_s(amount: float | None, median: float) -> float | None:
    return float(amount) / median if amount and median > 0 else None


def plan_figures(
    measurement: Measurement, results: Mapping[str, RunResult], baseline: str | None
) -> tuple[dict[str, dict[str, Any]], list[Event]]:
    """Per plan: step-time median and IQR, rates, MFU, speedup with interval, verdict, warm-up.

    Samples/s, tokens/s, FLOP/s and MFU all divide by the same steady-state median step time
    (all processes pooled), so they cannot disagree with the speedup. The MFU carries the range
    its peak's calibration repeats allow (``mfu_low`` / ``mfu_high``). An MFU above 1 is recorded
    as a ``calibration`` event that says what it means for that peak's source
    (:func:`~precision_nb.engine.peaks.beyond_peak`) and left out (None), not shown as
    utilisation. ``verdict_detail`` is the :class:`~precision_nb.engine.stats.
    Verdict` (wording, interval, method, how the measurement stopped, the load note).
    """
    events: list[Event] = []
    out: dict[str, dict[str, Any]] = {}
    busy = measurement.load_note
    for label, timing in measurement.plans.items():
        result = results.get(label)
        info = result.workload if result is not None else {}
        sp = measurement.spread(label)
        median = sp.median if sp.n else math.nan
        per_step = (info.get("batch_size") or 0) * (info.get("accumulation") or 1)
        tps = _tokens_per_sample(result) if result is not None else None
        flops_per_s = _per_s(info.get("flops_per_step"), median)
        peak = info.get("peak_flops_per_s")
        mfu = flops_per_s / peak if flops_per_s and peak else None
        peak_low, peak_high = info.get("peak_flops_low"), info.get("peak_flops_high")
        mfu_range = (
            (flops_per_s / peak_high, flops_per_s / peak_low)
            if flops_per_s and peak_low and peak_high
            else (mfu, mfu)
        )
        if mfu is not None and mfu > 1:
            events.append(
                Event(
                    "calibration",
                    f"{label}: achieved {flops_per_s / 1e9:.1f} GFLOP/s beats the peak "
                    f"({info.get('peak_source')}): {beyond_peak(info.get('peak_source'))}; MFU "
                    "is not shown",
                    {"run": label, "mfu": mfu, "source": info.get("peak_source")},
                )
            )
            mfu = None
            mfu_range = (None, None)
        warm = timing.warmup
        row: dict[str, Any] = {
            "median_step_time_s": median,
            "step_time_q1_s": sp.q1,
            "step_time_q3_s": sp.q3,
            "step_time_iqr_s": sp.iqr,
            "timed_steps": sp.n,
            "samples_per_s": _per_s(per_step, median),
            "tokens_per_s": _per_s(per_step * tps, median) if tps else None,
            "flops_per_s": flops_per_s,
            "mfu": mfu,
            "mfu_low": mfu_range[0],
            "mfu_high": mfu_range[1],
            "rounds": timing.rounds_completed,
            "processes": measurement.process_count,
            "warmup_steps": warm.steps if warm else 0,
            "warmup_s": warm.seconds if warm else 0.0,
            "warmup_rule": warm.rule if warm else "",
            "failed": timing.failed,
        }
        plan = getattr(result, "plan", None)
        if (
            str(getattr(result, "device", "")).startswith("cuda")
            and getattr(plan, "mode", "") == "fp32"
        ):
            row["tf32"] = tf32 = info.get("tf32") or tf32_state()
            if tf32_classes(tf32):
                events.append(
                    Event(
                        "measurement",
                        f"{label}: the fp32 baseline may run its "
                        f"{' and '.join(CLASS_WORDS[c] for c in tf32_classes(tf32))} as TF32 on "
                        f"tensor cores ({flags_text(tf32)}: convolutions default to TF32 on "
                        "Ampere and newer); speedups are against that baseline",
                        {"run": label, **tf32},
                    )
                )
        if baseline is not None and baseline in measurement.plans:
            speed = measurement.speedup(label, baseline)
            # the baseline by its label: "fp32+compile" where compiled plans are compared
            v = stats.verdict(label, speed, baseline=baseline, spread_of_plan=sp, busy=busy)
            if label == baseline:
                v = stats.Verdict(
                    "baseline", f"{label} is the baseline.", label=label, baseline=label,
                    stopped_by=speed.stopped_by, busy=busy,
                )  # fmt: skip
            row.update(
                speedup_vs_fp32=speed.estimate,
                speedup_ci_low=speed.low,
                speedup_ci_high=speed.high,
                speedup_half_width=v.half_width,
                speedup_method=v.method,
                speedup_covers=v.level,
                stopped_by=v.stopped_by,
                verdict_kind=v.kind,
                verdict=str(v),
                verdict_detail=v,
            )
        out[label] = row
    return out, events


def precision_request(mode: Any, lab: bool) -> PrecisionConfig:
    """A requested mode as a config; ``lab`` turns a plain fp16 request into the lab's."""
    if isinstance(mode, PrecisionConfig):
        return mode
    return PrecisionConfig(
        mode=mode,
        loss_scale_lab=lab and str(mode).strip().lower() in ("fp16", "float16", "half"),
    )


def _param_vector(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().cpu().reshape(-1) for p in model.parameters()])


def _plan_requests(
    requests: Sequence[PrecisionConfig],
    device: Any,
    optimizer: OptimizerConfig,
    out: Comparison,
    compiles: Sequence[str] = ("off",),
) -> dict[str, Explanation]:
    """Label -> explanation for every distinct plan (every request under every compile mode);
    merged and relabelled requests become events.

    A label is the requested mode, with " (loss-scale lab)" where the lab applies, then
    ``+compile`` (``+compile:<mode>``) for a compiled plan.
    """
    planned: dict[str, Explanation] = {}
    seen: dict[Any, str] = {}
    for request, mode in [(r, c) for r in requests for c in compiles]:
        explanation = explain_precision(request, device, optimizer=optimizer, compile=mode)
        plan = explanation.plan
        label = run_label(request.requested, lab_applies(explanation)) + explanation.compile.suffix
        if request.loss_scale_lab and not lab_applies(explanation):
            # The lab is a CPU opt-in; elsewhere (CUDA fp16 has the real scaler) the label must
            # not claim it.
            out.events.append(
                Event(
                    "fallback",
                    f"{run_label(label, True)}: the loss-scale lab applies to fp16 on CPU only; "
                    f"on {explanation.device} this runs as plain {request.requested}",
                    {"field": "loss_scale_lab", "requested": True, "used": False, "run": label},
                )
            )
        if label in planned or label in out.merged:
            out.events.append(
                Event(
                    "merged", f"{label}: requested twice; run once", {"label": label, "into": label}
                )
            )
            continue
        key = (plan, explanation.compile.requested)
        if key in seen:
            first = seen[key]
            out.merged[label] = first
            reasons = explanation.fallbacks or explanation.decisions
            why = "; ".join(d.reason for d in reasons if d.field != "device")
            out.events.append(
                Event(
                    "merged",
                    f"{label} resolves to the same plan as {first} ({plan.mode} on "
                    f"{explanation.device}); run once. Why: {why}",
                    {"label": label, "into": first, "why": why},
                )
            )
            continue
        seen[key] = label
        planned[label] = explanation
    return planned


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
    "max-autotune"); every precision is measured under every mode.
    """
    if isinstance(modes, (str, PrecisionConfig)):
        modes = [modes]
    modes = list(modes)
    if not modes:
        raise ValueError("modes is empty; allowed: one or more of auto, fp32, bf16, fp16")
    validate.boolean("loss_scale_lab", loss_scale_lab)
    if model is not None and batches is None:
        raise ValueError("batches is None; pass batches together with your own model")
    request = RunRequest.of(
        model if model is not None else workload, batches, preset=preset, device=device,
        precision=[precision_request(m, loss_scale_lab) for m in modes], optimizer=optimizer,
        train=train, loss_fn=loss_fn, compile=compile, **train_options,
    )  # fmt: skip
    return run_comparison(request, callbacks=callbacks, stop=stop, measure=measure)


def run_comparison(
    request: RunRequest,
    *,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    measure: MeasureConfig | None = None,
) -> Comparison:
    """:func:`compare` for a request already checked (``RunRequest.of``): every precision of
    ``request.precisions`` on the same weights and data."""
    cfg, device, optimizer = request.train, request.device, request.optimizer
    loss_fn = request.loss_fn
    dispatch = Callbacks(callbacks)
    model, batches, info = request.prepare()
    if isinstance(batches, Iterable) and iter(batches) is batches:
        raise ValueError(
            f"batches has type {type(batches).__name__}, a one-shot iterator; compare needs "
            "batches it can replay for every plan: a callable, a DataLoader or a list"
        )
    initial = copy.deepcopy(model).cpu()
    out = Comparison()
    out.model_info = {
        "class": type(model).__qualname__,
        "params": sum(p.numel() for p in model.parameters()),
    }
    planned = _plan_requests(request.precisions, device, optimizer, out, request.compiles)
    breaks, untraceable = comparing.check_breaks(planned, initial, batches, loss_fn, out.events)
    for label in untraceable:
        del planned[label]
    mcfg = measure if measure is not None else MeasureConfig()
    trainers: dict[str, Trainer] = {}
    warm_trainers: dict[str, Trainer] = {}
    precisions = {label: e.config for label, e in planned.items()}
    compiles = {label: e.compile.requested for label, e in planned.items()}
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
    # the speed baseline: eager fp32, else a compiled fp32 plan (every plan compiled)
    fp32 = [k for k, e in planned.items() if e.config.requested == "fp32"]
    baseline = next((k for k in fp32 if compiles[k] == "off"), next(iter(fp32), None))
    measurement, sessions, failures = measure_in_processes(
        [PlanSpec(label, precisions[label], compiles[label]) for label in planned],
        make_session, cfg.steps, mcfg, rebuild=rebuild, single_reason=single_reason,
        baseline=baseline, stop=stop, on_warmup=dispatch.warmup, callbacks=dispatch,
        progress=cfg.progress,
    )  # fmt: skip
    out.measurement = measurement
    out.events.extend(measurement.events)
    reference: torch.Tensor | None = None
    ref_label: str | None = None
    for label, session in sessions.items():
        failure = failures.get(label)
        partial = partial_result(failure)
        result = partial if isinstance(partial, RunResult) else session.result
        if failure is None:
            result = session.finish()
        out.results[label] = result
        out.events.extend(e.prefixed(label) for e in result.events)
        params = _param_vector(trainers[label].model)
        if result.plan.mode == "fp32" and failure is None and label == baseline:
            reference, ref_label = params, label
        elif result.plan.mode == "fp32" and reference is None and failure is None:
            reference, ref_label = params, label
        out.drift[label] = {"params": params}  # type: ignore[dict-item]
        if result.stopped or measurement.stopped:
            out.stopped = True
    out.failures = {label: str(measurement.plans[label].failed) for label in failures}
    out.compiled, more = comparing.collect(
        planned, measurement, out.results, trainers, warm_trainers, breaks
    )
    out.events.extend(more)
    out.figures, more = plan_figures(measurement, out.results, ref_label)
    out.events.extend(more)
    out.method = measurement.method()
    if cfg.measure_peak:
        dtypes = tuple({compute_dtype(r.plan) for r in out.results.values()} - {torch.float32})
        first = next(iter(out.results.values()), None)
        if first is not None and dtypes:
            out.peak_ratios = peak_ratios(torch.device(first.device), dtypes)
    for label, d in out.drift.items():
        params = d.pop("params")  # type: ignore[arg-type]
        ref = out.results[ref_label] if ref_label else None
        if reference is None or ref is None:
            d.update(final_loss_diff=None, param_rel_diff=None)
            continue
        loss, ref_loss = out.results[label].final_loss, ref.final_loss
        d["final_loss_diff"] = None if loss is None or ref_loss is None else loss - ref_loss
        denom = float(reference.norm()) or 1.0
        d["param_rel_diff"] = float((params - reference).norm()) / denom
    if reference is None:
        out.events.append(Event("warning", "no fp32 run among the requests: drift is None"))
    if failures:  # loud, after the other plans finished: the first failure as it was raised
        label, first = next(iter(failures.items()))
        where = f"plan {label} of the comparison failed with this error (every failed plan: "
        raise attach_result(first, out, where + "`.result.failures`); ")
    return out
