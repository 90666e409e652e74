"""``measure_distributed``: every plan of a distributed profile in ONE torchrun launch, measured
by the single-device method (:mod:`precision_nb.engine.measure`), the ranks' times merged.

Each rank runs :mod:`precision_nb.engine.distributed.rank_measure`. A distributed step is as slow
as its slowest rank, so the launcher merges the ranks' block times step by step (the maximum over
the ranks) into one :class:`~precision_nb.engine.measure.Measurement`: its spreads, paired
speedups and verdicts are computed exactly as for one process. Each plan also gets its own
:class:`~precision_nb.engine.distributed.results.DistributedResult` (records, bytes per step by
op and dtype, memory per rank), with each rank's own measured step times in ``timed_steps``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from precision_nb.core.distributed import Distributed, explain_distributed
from precision_nb.core.events import Event
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine import load as machine_load
from precision_nb.engine.callbacks import Callbacks
from precision_nb.engine.distributed.failure import failure
from precision_nb.engine.distributed.launcher import Rank0Follower, plan_spec, write_spec
from precision_nb.engine.distributed.parallel import check_divisible
from precision_nb.engine.distributed.process import read_ranks, run_torchrun, stopped_not_failed
from precision_nb.engine.distributed.results import DistributedResult, rank_lines
from precision_nb.engine.measure import warmup_event as _warmup_event
from precision_nb.engine.measure_config import MeasureConfig
from precision_nb.engine.measurement import Measurement, PlanTiming, Warmup
from precision_nb.engine.stats import ONE_LAUNCH
from precision_nb.engine.time_split import SplitConfig, split_distributed
from precision_nb.engine.workloads import get_workload

__all__ = [
    "MeasuredRuns",
    "compare_distributed",
    "distributed_plans",
    "global_workload",
    "measure_distributed",
    "merge_measurement",
    "slowest_per_step",
]

#: How a distributed step time is formed from the ranks' times (shown with the method).
STEP_RULE = (
    "a distributed step takes as long as its slowest rank: per step, the maximum over the ranks "
    "of their step times; the warm-up ends when every rank's own rule has ended it (agreed by an "
    "all-reduce, so all ranks stop at the same step); per-rank spreads in distributed_steps.csv"
)


@dataclass
class MeasuredRuns:
    """What :func:`measure_distributed` gives back."""

    #: The merged measurement (slowest rank per step): spreads, speedups, verdicts as one process.
    measurement: Measurement
    #: Label -> the plan's ``DistributedResult`` (its lines of every rank's log).
    results: dict[str, DistributedResult] = field(default_factory=dict)
    #: Each rank's own ``measurement`` line (warm-ups, block times, orders), rank order.
    ranks: list[dict[str, Any] | None] = field(default_factory=list)
    seconds: float = 0.0
    startup_s: float | None = None
    stopped: bool = False
    #: Label -> each rank's ``time_split`` data (rank order, None where a rank wrote none);
    #: empty when no time split was asked for.
    time_splits: dict[str, list[dict[str, Any] | None]] = field(default_factory=dict)


def slowest_per_step(blocks: Sequence[Sequence[float]]) -> tuple[list[float], bool]:
    """Per step, the largest of the ranks' times; (times, whether the ranks' counts differed).

    An empty block on any rank (a plan that failed or stopped in that round) gives no times."""
    if not blocks or any(len(b) == 0 for b in blocks):
        return [], False
    n = min(len(b) for b in blocks)
    return [max(float(b[i]) for b in blocks) for i in range(n)], any(len(b) != n for b in blocks)


def _merge_warmup(label: str, warms: list[dict[str, Any] | None], events: list[Event]) -> Any:
    if not warms or any(w is None for w in warms):
        return None
    steps = {int(w["steps"]) for w in warms}  # type: ignore[index]
    if len(steps) > 1:  # the agreement makes this impossible; say so loudly if it ever happens
        events.append(
            Event(
                "warning",
                f"{label}: the ranks ended the warm-up after different step counts "
                f"({sorted(steps)}); the step times are merged over the common steps",
                {"run": label, "warmup_steps": sorted(steps)},
            )
        )
    times, _ = slowest_per_step([w["times"] for w in warms])  # type: ignore[index]
    rules = list(dict.fromkeys(str(w["rule"]) for w in warms))  # type: ignore[index]
    rule = (
        f"{rules[0]} (on each of the {len(warms)} ranks, agreed)"
        if len(rules) == 1
        else "; ".join(f"rank {i}: {w['rule']}" for i, w in enumerate(warms))  # type: ignore[index]
    )
    seconds = max(float(w["seconds"]) for w in warms)  # type: ignore[index]
    return Warmup(max(steps), seconds, rule, tuple(times))


def merge_measurement(
    items: Sequence[dict[str, Any] | None], cfg: MeasureConfig, labels: Sequence[str]
) -> Measurement:
    """One Measurement from every rank's ``measurement`` line: per plan and round, the slowest
    rank's time of each step; warm-ups merged (steps, the longest seconds, the slowest times)."""
    present = [i for i in items if i is not None]
    first = present[0] if present else {"sizes": [], "orders": [], "plans": {}}
    m = Measurement(cfg, list(first["sizes"]), {label: PlanTiming(label) for label in labels})
    m.orders = [list(o) for o in first["orders"]]
    m.stopped_by = ONE_LAUNCH
    m.stopped = len(present) < len(items) or any(i.get("stopped") for i in present)
    complete = len(present) == len(items)
    for label in labels:
        per_rank = [i["plans"].get(label, {}) for i in present]
        timing = m.plans[label]
        timing.warmup = (
            _merge_warmup(label, [p.get("warmup") for p in per_rank], m.events)
            if complete
            else None
        )
        if timing.warmup is not None:
            m.events.append(_warmup_event(label, timing.warmup))
        uneven = False
        for r in range(len(m.sizes)):
            blocks = [
                p.get("blocks", [])[r] if r < len(p.get("blocks", [])) else [] for p in per_rank
            ]
            times, differ = slowest_per_step(blocks if complete else [])
            uneven = uneven or differ
            timing.blocks.append(times)
        if uneven:
            m.events.append(
                Event(
                    "warning",
                    f"{label}: the ranks timed different numbers of steps in a round; the "
                    "slowest rank's time is taken over the steps they share",
                    {"run": label},
                )
            )
        timing.failed = next((p["failed"] for p in per_rank if p.get("failed")), None)
    return m


def measure_distributed(
    model: str,
    batches: str | None = None,
    *,
    plans: Mapping[str, PrecisionConfig],
    distributed: Distributed,
    preset: str = "tiny",
    device: Any = "auto",
    optimizer: OptimizerConfig | None = None,
    measure: MeasureConfig | None = None,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    time_split: Any = None,
    **train_options: Any,
) -> MeasuredRuns:
    """Measure ``plans`` (label -> precision request) on ``model`` in one torchrun launch of
    ``distributed.nproc`` ranks; see the module docstring. ``model``: a built-in workload name (at
    ``preset``) or ``"package.module:factory"`` with ``batches="package.module:function"``, as
    for ``fit_distributed``.

    ``train_options`` are ``TrainConfig`` fields (``steps``: measured steps per plan, split over
    ``measure.rounds``). ``callbacks`` get rank 0's records (``on_log``, each with its ``run``
    label) and the phases as they start (``on_phase(text)``: "warm-up of bf16", "round 3/8").
    ``time_split``: a :class:`~precision_nb.engine.time_split.SplitConfig`: after the timed
    rounds every rank profiles a few steps of each plan (``MeasuredRuns.time_splits``).
    A failing rank raises :class:`~precision_nb.engine.distributed.results.DistributedError`
    (``.results``: label -> each plan's records so far).
    """
    labels = list(plans)
    if not labels:
        raise ValueError("plans is empty; allowed: one or more label -> PrecisionConfig")
    dispatch = Callbacks(callbacks)
    mcfg = measure if measure is not None else MeasureConfig()
    opt = optimizer if optimizer is not None else OptimizerConfig()
    run_dir = Path(tempfile.mkdtemp(prefix="precision_nb_dist_"))
    try:
        first, spec_path = write_spec(
            model, batches, distributed=distributed, preset=preset, device=device,
            precision=plans[labels[0]], optimizer=opt, run_dir=run_dir, **train_options,
        )  # fmt: skip
        resolved = {
            label: explain_distributed(first.request, prec, device, optimizer=opt)
            for label, prec in plans.items()
        }
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
        spec["plans"] = [
            {"label": label, "precision": plans[label].to_dict(), "plan": plan_spec(p)}
            for label, p in resolved.items()
        ]
        spec["measure"] = asdict(mcfg)
        spec["time_split"] = asdict(time_split) if time_split is not None else None
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    start = machine_load.sample()
    run = run_torchrun(first.request, spec_path, run_dir, stop, Rank0Follower(dispatch, run_dir))
    everything = read_ranks(run_dir)
    per_plan = {label: read_ranks(run_dir, plan=label) for label in labels}
    if run.stopped:
        for ranks in [everything, *per_plan.values()]:
            stopped_not_failed(ranks)
    results = {label: run.result(resolved[label], per_plan[label]) for label in labels}
    if run.failed(everything) or any(run.failed(ranks) for ranks in per_plan.values()):
        error = failure(run.result(first, everything), run)
        shutil.rmtree(run_dir, ignore_errors=True)
        error.results = results  # type: ignore[attr-defined]
        raise error
    logs = {r.rank: rank_lines(run_dir / f"rank{r.rank}.jsonl") for r in everything}
    shutil.rmtree(run_dir, ignore_errors=True)
    lines = {rank: _last(items, "measurement") for rank, items in logs.items()}
    measurement = merge_measurement(list(lines.values()), mcfg, labels)
    measurement.load = machine_load.Load(start, machine_load.sample())  # torchrun: a waited child
    measurement.events.append(measurement.load.event())
    out = MeasuredRuns(measurement, results, list(lines.values()), run.seconds)
    out.stopped = run.stopped or measurement.stopped
    if time_split is not None:
        out.time_splits = {
            label: [_last(logs[rank], "time_split", label) for rank in sorted(logs)]
            for label in labels
        }
    phases = [next((i for i in items if i.get("kind") == "phase"), None) for items in logs.values()]
    if phases and all(p is not None for p in phases):  # launch -> every rank's first warm-up
        out.startup_s = max(float(p["t"]) for p in phases if p is not None) - run.t0
    for label, result in results.items():
        result.startup_s = out.startup_s
        result.timed_steps = {
            r: [t for block in _plan_of(line, label).get("blocks", []) for t in block]
            for r, line in lines.items()
        }
    return out


def _plan_of(line: dict[str, Any] | None, label: str) -> dict[str, Any]:
    return ((line or {}).get("plans") or {}).get(label) or {}


def _last(items: list[dict[str, Any]], kind: str, plan: str | None = None) -> dict[str, Any] | None:
    found = [i for i in items if i.get("kind") == kind and plan in (None, i.get("plan"))]
    return found[-1] if found else None


def global_workload(workload: Mapping[str, Any], nproc: int) -> dict[str, Any]:
    """Rank 0's workload facts scaled to the whole run: each rank trains 1/nproc of the global
    batch, so samples and FLOPs per step and the peak (one per rank) are nproc times a rank's;
    the MFU (FLOP/s over peak) stays a rank's."""
    out = dict(workload, nproc=nproc, rank_batch_size=workload.get("batch_size"))
    for key in ("batch_size", "flops_per_step", "peak_flops_per_s"):
        if isinstance(out.get(key), (int, float)):
            out[key] = out[key] * nproc
    if out.get("peak_source"):
        out["peak_source"] = f"{out['peak_source']}; x{nproc} ranks"
    return out


class _PrintPhases:
    """Prints each phase of a distributed measurement as rank 0 starts it."""

    def on_phase(self, text: str) -> None:
        print(f"precision_nb: distributed: {text}", flush=True)


def distributed_plans(request: Any) -> dict[PrecisionConfig, Any]:
    """Each precision request resolved on torchrun's ranks (request -> ``DistributedPlan``).

    ``ValueError`` for a model object (it cannot reach the workers: use ``fit_distributed``
    with a factory) or a global batch not divisible by the ranks; ``RuntimeError`` for a
    machine that cannot run it (nccl without CUDA, more processes than GPUs, MPS).
    """
    dist = request.distributed
    if not isinstance(request.model, str) or dist is None:
        raise ValueError(
            f"distributed: a profile of a model object ({type(request.model).__name__}) cannot "
            "run on torchrun workers; allowed: a built-in workload name (mlp, transformer, "
            "cnn), or fit_distributed(model, factory='package.module:factory') for your own "
            "model"
        )
    info = get_workload(request.model, request.preset).info
    where = f"workload {request.model!r} at {request.preset!r}"
    check_divisible(info["batch_size"], dist.nproc, where, dist.nnodes)
    return {
        p: explain_distributed(dist, p, request.device, optimizer=request.optimizer)
        for p in request.precisions
    }


def compare_distributed(request: Any, *, stop: Any = None) -> tuple[Any, dict[str, Any]]:
    """A distributed :class:`~precision_nb.engine.request.RunRequest` measured in one torchrun
    launch, by the same planning and typed result as a comparison in this process.

    Returns the ``Comparison`` (rank-merged records per plan: loss averaged over ranks, the
    slowest rank's step time; speedups, verdicts, the final-loss drift: the parameters stay on
    the ranks, sharded under FSDP2, so their drift is not measured) and label -> the plan's
    ``DistributedResult``. With ``request.train.progress`` each phase is printed as it starts.
    """
    from precision_nb.engine.comparison import Comparison, Drift, plan_outcomes
    from precision_nb.engine.planning import plan_runs

    resolved = distributed_plans(request)
    planning = plan_runs(request, explain=lambda precision, _mode: resolved[precision].precision)
    rank_device = {r.label: resolved[r.precision].rank_device for r in planning.runs}
    cfg, dist = request.train, request.distributed
    if cfg.progress:
        print(
            f"precision_nb: {dist.strategy} x{dist.nproc}: one torchrun launch measures "
            f"{', '.join(planning.labels)} ({cfg.steps} steps each after a warm-up)",
            flush=True,
        )
    split = SplitConfig() if "time_split" in request.analyses else None
    measured = measure_distributed(
        request.model, plans=planning.precisions, distributed=dist, preset=request.preset,
        device=request.device, optimizer=request.optimizer, measure=request.measure,
        callbacks=[_PrintPhases()] if cfg.progress else [], stop=stop, steps=cfg.steps,
        log_every=cfg.log_every, accumulation=cfg.accumulation, time_split=split,
    )  # fmt: skip
    out = Comparison(merged=dict(planning.merged), events=list(planning.events))
    for label, result in measured.results.items():
        out.results[label] = result.run_result(
            label=label,
            device=rank_device[label],
            records=[{**r, "run": label} for r in result.records],
            workload=global_workload(result.rank0.get("workload", {}), len(result.ranks)),
        )
    m = out.measurement = measured.measurement
    out.stopped = measured.stopped
    out.events.extend(m.events)
    base = out.baseline = planning.baseline
    ref = out.results[base].final_loss if base in out.results else None
    drift = {
        k: Drift(None if ref is None or r.final_loss is None else r.final_loss - ref)
        for k, r in out.results.items()
    }
    out.outcomes, more = plan_outcomes(m, out.results, base, drift=drift)
    out.events.extend(more)
    if split is not None:  # each rank profiled its plans after the timed rounds
        out.events.extend(split_distributed(out, measured.time_splits, split))
    out.method = {**m.method(), "distributed step time": STEP_RULE}
    return out, measured.results
