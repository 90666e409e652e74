"""A distributed profile: every plan in one torchrun launch (one process per rank), measured by
the single-device method (:func:`~precision_nb.engine.distributed.measured.measure_distributed`:
warm-up agreed over the ranks, rounds with the order rotated, the slowest rank per step), gathered
into a ``Comparison`` for the usual report (speedups with their interval, verdicts), plus the
per-rank step times, memory by kind and dtype and communication bytes per step in a section.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from precision_nb.views.report.markup import table_html
from precision_nb.views.report.sections import Section, csv_file

__all__ = [
    "DISTRIBUTED_FILES",
    "TITLE",
    "check_distributed",
    "distributed_body",
    "distributed_html",
    "distributed_section",
    "global_workload",
    "rank_step_table",
    "run_distributed",
]

#: The files a distributed profile adds to the report folder (and ``distributed_nodes.csv``, one
#: row per node, for a run over several nodes).
DISTRIBUTED_FILES = ("distributed_steps.csv", "distributed_memory.csv", "distributed_comm.csv")


def _precision(mode: str, loss_scale_lab: bool) -> Any:
    from precision_nb.core.plan import PrecisionConfig

    return PrecisionConfig(mode=mode, loss_scale_lab=loss_scale_lab)


def check_distributed(
    distributed: Any,
    *,
    model: Any,
    workload: str,
    preset: str,
    modes: Sequence[str],
    device: str,
    loss_scale_lab: bool,
    fused: bool | None,
) -> dict[str, Any]:
    """Resolve every plan of a distributed profile before anything starts; request -> plan.

    ``ValueError`` for a bad request (not a ``Distributed``, a model object instead of a built-in
    workload, a global batch not divisible by ``nproc``); ``RuntimeError`` for a machine that
    cannot run it (nccl without CUDA, more processes than GPUs, MPS).
    """
    from precision_nb.core.distributed import Distributed, explain_distributed
    from precision_nb.core.optim import OptimizerConfig
    from precision_nb.engine.distributed.parallel import check_divisible
    from precision_nb.engine.workloads import get_workload

    if not isinstance(distributed, Distributed):
        raise ValueError(
            f"distributed: invalid value of type {type(distributed).__name__}; allowed: "
            "precision_nb.Distributed(strategy=..., nproc=...) or None"
        )
    if model is not None:
        raise ValueError(
            f"distributed: a profile of a model object ({type(model).__name__}) cannot run on "
            "torchrun workers; allowed: a built-in workload name (mlp, transformer, cnn), or "
            "fit_distributed(model, factory='package.module:factory') for your own model"
        )
    info = get_workload(workload, preset).info
    where = f"workload {workload!r} at {preset!r}"
    check_divisible(info["batch_size"], distributed.nproc, where, distributed.nnodes)
    optimizer = OptimizerConfig(fused=fused)
    return {
        mode: explain_distributed(
            distributed, _precision(mode, loss_scale_lab), device, optimizer=optimizer
        )
        for mode in modes
    }


def run_distributed(
    request: Any,
    *,
    steps: int,
    log_every: int,
    progress: bool = True,
    stop: Any = None,
    measure: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """Measure the distinct plans of ``request`` in one torchrun launch.

    Returns a ``Comparison`` (the merged measurement with its figures, speedups and verdicts;
    rank-merged records per plan: loss averaged over ranks, the slowest rank's step time;
    requests with the same resolved plan merged) and label -> the plan's ``DistributedResult``.
    ``measure``: a ``MeasureConfig`` (default: the engine's). With ``progress`` each phase (the
    warm-up of a plan, round r of R) is printed as it starts.
    """
    from precision_nb.core.events import Event
    from precision_nb.core.optim import OptimizerConfig
    from precision_nb.engine.compare import Comparison
    from precision_nb.engine.distributed.measured import measure_distributed

    plans = check_distributed(
        request.distributed,
        model=request.model,
        workload=request.workload,
        preset=request.preset,
        modes=request.modes,
        device=request.device,
        loss_scale_lab=request.loss_scale_lab,
        fused=request.fused,
    )
    comparison = Comparison()
    distinct: dict[str, Any] = {}
    labels: dict[str, str] = {}  # resolved plan -> label of the run that trains it
    for mode, dplan in plans.items():
        key = repr(dplan.precision.plan)
        if key in labels:
            expl = dplan.precision
            why = "; ".join(
                d.reason for d in (expl.fallbacks or expl.decisions) if d.field != "device"
            )
            comparison.merged[mode] = labels[key]
            comparison.events.append(
                Event(
                    "merged",
                    f"{mode} resolved to the same plan as {labels[key]}: run once",
                    {"label": mode, "into": labels[key], "why": why},
                )
            )
            continue
        labels[key] = comparison.merged[mode] = mode
        distinct[mode] = _precision(mode, request.loss_scale_lab)
    first = plans[next(iter(distinct))]
    if progress:
        print(
            f"precision_nb: {first.request.strategy} x{first.request.nproc}: one torchrun launch "
            f"measures {', '.join(distinct)} ({steps} steps each after a warm-up)",
            flush=True,
        )
    measured = measure_distributed(
        request.workload,
        plans=distinct,
        distributed=request.distributed,
        preset=request.preset,
        device=request.device,
        optimizer=OptimizerConfig(fused=request.fused),
        measure=measure,
        callbacks=[_PrintPhases()] if progress else [],
        stop=stop,
        steps=steps,
        log_every=log_every,
        accumulation=request.accumulation,
    )
    _fill(comparison, measured, {label: plans[label] for label in distinct})
    return comparison, measured.results


class _PrintPhases:
    """Prints each phase of a distributed measurement as rank 0 starts it."""

    def on_phase(self, text: str) -> None:
        print(f"precision_nb: distributed: {text}", flush=True)


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


def _fill(comparison: Any, measured: Any, plans: Mapping[str, Any]) -> None:
    """The comparison of a distributed measurement: runs, figures, method, drift of the loss."""
    from precision_nb.engine.compare import plan_figures
    from precision_nb.engine.distributed.measured import STEP_RULE

    for label, result in measured.results.items():
        dplan = plans[label]
        comparison.results[label] = result.run_result(
            label=label,
            device=dplan.rank_device,
            records=[{**r, "run": label} for r in result.records],
            workload=global_workload(result.rank0.get("workload", {}), len(result.ranks)),
        )
    m = measured.measurement
    comparison.measurement = m
    comparison.stopped = measured.stopped
    comparison.events.extend(m.events)
    results = comparison.results
    base = next((k for k, r in results.items() if r.plan.mode == "fp32"), None)
    comparison.figures, more = plan_figures(m, results, base)
    comparison.events.extend(more)
    comparison.method = {**m.method(), "distributed step time": STEP_RULE}
    comparison.failures = {k: str(t.failed) for k, t in m.plans.items() if t.failed}
    ref = results[base].final_loss if base is not None else None
    for label, result in results.items():
        loss = result.final_loss
        diff = None if ref is None or loss is None else loss - ref
        # parameters stay on the ranks (sharded under FSDP2): their drift is not measured here
        comparison.drift[label] = {"final_loss_diff": diff, "param_rel_diff": None}


def rank_step_table(label: str, result: Any) -> list[dict[str, Any]]:
    """Per rank: its own step times' median and IQR (seconds) and its final loss.

    From the rank's measured steps (``timed_steps``, the rounds of a distributed profile), else
    from its logged intervals (a ``fit_distributed`` result); ``timing`` says which."""
    from precision_nb.engine.stats import spread

    timed = result.timed_steps
    rows = []
    for rank in result.ranks:
        if timed:
            times, how = list(timed.get(rank.rank, [])), "measured steps of the rounds"
        else:
            times = [float(r["step_time_s"]) for r in rank.records if r.get("step_time_s")]
            how = "logged intervals"
        sp = spread(times)
        several = len({r.node for r in result.ranks}) > 1
        rows.append(
            {
                "plan": label,
                "rank": rank.rank,
                **({"node": rank.node} if several else {}),
                "timing": how,
                "steps_timed": sp.n,
                "median_step_time_s": sp.median,
                "step_time_q1_s": sp.q1,
                "step_time_q3_s": sp.q3,
                "step_time_iqr_s": sp.iqr,
                "final_loss": rank.records[-1]["loss"] if rank.records else None,
            }
        )
    return rows


def _tables(runs: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"steps": [], "memory": [], "comm": []}
    for label, result in runs.items():
        out["steps"] += rank_step_table(label, result)
        out["memory"] += [{"plan": label, **r} for r in result.memory_table()]
        out["comm"] += [{"plan": label, **r} for r in result.comm_table()]
    return out


#: The title of the distributed section.
TITLE = "Distributed: per rank"


def _all_tables(runs: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The per-rank tables, and one row per node when a run spans several nodes."""
    tables = _tables(runs)
    nodes = [
        {"plan": label, **row}
        for label, result in runs.items()
        if hasattr(result, "node_table")
        for row in result.node_table()
    ]
    if len({row["node"] for row in nodes}) > 1:  # a run over several nodes: one row per node
        tables["nodes"] = nodes
    return tables


def distributed_section(runs: Mapping[str, Any]) -> Section:
    """The report's distributed section: its CSVs and their HTML (nothing written)."""
    import pandas as pd

    files = tuple(
        csv_file(f"distributed_{name}.csv", pd.DataFrame(rows))
        for name, rows in _all_tables(runs).items()
    )
    return Section("distributed", TITLE, distributed_body(runs), files)


def distributed_html(runs: Mapping[str, Any]) -> str:
    """The distributed section with its title, for a notebook."""
    return f'<section class="distributed"><h3>{TITLE}</h3>{distributed_body(runs)}</section>'


def distributed_body(runs: Mapping[str, Any]) -> str:
    """Per plan: the plan, its start-up, per-node and per-rank tables (step time, memory, comm)."""
    e = html.escape
    tables = _tables(runs)
    measured = any(getattr(r, "timed_steps", None) for r in runs.values())
    how = (
        "All plans ran in one torchrun launch, one process per rank, and were measured as in "
        "one process (warm-up apart, its end agreed by the ranks; rounds with the plan order "
        "rotated); the speedups and verdicts of this report use the slowest rank's time of each "
        "step. Step time here: each rank's own median and IQR (inclusive quartiles) over its "
        "timed steps."
        if measured
        else "A training run, one process per rank (not an interleaved measurement: no "
        "speedup). Step time here: each rank's own median and IQR (inclusive quartiles) over "
        "its logged intervals."
    )
    parts = [
        f"<p>{how} Communication: mean bytes per optimizer step of "
        "every collective each rank issued, by op and dtype (full buffer of each call; setup "
        "collectives before the first step left out). Memory: bytes each rank holds by kind and "
        "dtype, read from the tensors.</p>",
    ]
    for label, result in runs.items():
        plan = result.plan
        summary = plan.summary() if hasattr(plan, "summary") else str(plan)
        start = f"; start-up {result.startup_s:.1f} s" if result.startup_s is not None else ""
        parts.append(f"<h3>{e(label)}</h3><p>{e(summary)}{e(start)}</p>")
        parts.append(_nodes_html(result))
        for name, title in (("steps", "step time"), ("memory", "memory"), ("comm", "comm")):
            rows = [r for r in tables[name] if r["plan"] == label]
            if not rows:
                parts.append(f"<p>No {title} rows were recorded.</p>")
                continue
            parts.append(table_html(rows, [c for c in rows[0] if c != "plan"], css_class="compact"))
    return "\n".join(parts)


def _nodes_html(result: Any) -> str:
    """Per node (a run over several): host, ranks, steps, final loss, median step time."""
    rows = result.node_table() if hasattr(result, "node_table") else []
    if len(rows) < 2:
        return ""
    return (
        "<p>Per node: its ranks' records merged per step (loss averaged over the node's ranks, "
        "the slowest rank's step time); median over the logged intervals.</p>"
        + table_html(rows, list(rows[0]), css_class="compact")
    )
