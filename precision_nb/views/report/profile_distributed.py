"""A distributed profile: each plan trained by ``fit_distributed`` (torchrun, one process per
rank), its records gathered into a ``Comparison`` for the usual report, and the per-rank step
times, memory by kind and dtype and communication bytes per step in a report section.

The plans run one after another (not interleaved), so their speed figures are single-run figures:
medians over the logged intervals, without a paired interval (see docs/distributed.md).
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DISTRIBUTED_FILES",
    "check_distributed",
    "distributed_html",
    "rank_step_table",
    "run_distributed",
    "write_distributed",
]

#: The files a distributed profile adds to the report folder.
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
    check_divisible(info["batch_size"], distributed.nproc, f"workload {workload!r} at {preset!r}")
    optimizer = OptimizerConfig(fused=fused)
    return {
        mode: explain_distributed(
            distributed, _precision(mode, loss_scale_lab), device, optimizer=optimizer
        )
        for mode in modes
    }


def run_distributed(
    request: Any, *, steps: int, log_every: int, progress: bool = True, stop: Any = None
) -> tuple[Any, dict[str, Any]]:
    """Train each distinct plan of ``request`` under ``fit_distributed``.

    Returns a ``Comparison`` (rank-merged records per plan: loss averaged over ranks, the slowest
    rank's step time; requests with the same resolved plan merged) and label -> the plan's
    ``DistributedResult``.
    """
    from precision_nb.core.events import Event
    from precision_nb.core.optim import OptimizerConfig
    from precision_nb.engine.compare import Comparison
    from precision_nb.engine.distributed.launcher import fit_distributed
    from precision_nb.engine.results import RunResult

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
    runs: dict[str, Any] = {}
    labels: dict[str, str] = {}  # resolved plan -> label of the run that trained it
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
        label = labels[key] = mode
        comparison.merged[mode] = label
        if progress:
            print(f"precision_nb: {dplan.summary()}: training {steps} steps", flush=True)
        result = fit_distributed(
            request.workload,
            distributed=request.distributed,
            preset=request.preset,
            device=request.device,
            precision=_precision(mode, request.loss_scale_lab),
            optimizer=OptimizerConfig(fused=request.fused),
            steps=steps,
            log_every=log_every,
            accumulation=request.accumulation,
            stop=stop,
        )
        runs[label] = result
        rank0 = (result.ranks[0].result or {}) if result.ranks else {}
        comparison.results[label] = RunResult(
            label=label,
            plan=dplan.precision.plan,
            explanation=dplan.precision,
            optimizer_outcome=None,
            device=dplan.rank_device,
            records=[{**r, "run": label} for r in result.records],
            scale_history=list(rank0.get("scale_history", [])),
            workload=dict(rank0.get("workload", {})),
            stopped=result.stopped,
            steps=int(rank0.get("steps", 0)),
            seconds=result.seconds,
            final_loss=result.final_loss,
        )
        comparison.stopped = comparison.stopped or result.stopped
        if comparison.stopped:
            break
    return comparison, runs


def rank_step_table(label: str, result: Any) -> list[dict[str, Any]]:
    """Per rank: logged intervals, median and IQR of the step time (seconds), final loss."""
    rows = []
    for rank in result.ranks:
        times = [float(r["step_time_s"]) for r in rank.records if r.get("step_time_s")]
        q = statistics.quantiles(times, n=4) if len(times) >= 2 else [float("nan")] * 3
        rows.append(
            {
                "plan": label,
                "rank": rank.rank,
                "logged_intervals": len(times),
                "median_step_time_s": statistics.median(times) if times else float("nan"),
                "step_time_iqr_s": q[2] - q[0],
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


def write_distributed(out: Path, runs: Mapping[str, Any]) -> tuple[dict[str, Path], str]:
    """Write the three CSVs into ``out``; (name -> path, the report's HTML section)."""
    import pandas as pd

    files: dict[str, Path] = {}
    for name, rows in _tables(runs).items():
        path = out / f"distributed_{name}.csv"
        pd.DataFrame(rows).to_csv(path, index=False)
        files[path.name] = path
    return files, distributed_html(runs)


def distributed_html(runs: Mapping[str, Any]) -> str:
    """The report's section: per plan the plan, start-up, and per-rank tables."""
    from precision_nb.views.report.html import _fmt

    e = html.escape
    tables = _tables(runs)
    parts = [
        '<section class="distributed"><h2>Distributed: per rank</h2>',
        "<p>Each plan trained once under torchrun, one process per rank, the plans one after "
        "another (not interleaved): the step times are single-run figures (median and IQR over "
        "the logged intervals of each rank). Communication: mean bytes per optimizer step of "
        "every collective each rank issued, by op and dtype (full buffer of each call; setup "
        "collectives before the first step left out). Memory: bytes each rank holds by kind and "
        "dtype, read from the tensors.</p>",
    ]
    for label, result in runs.items():
        plan = getattr(result, "plan", None)
        summary = plan.summary() if hasattr(plan, "summary") else str(plan)
        start = f"; start-up {result.startup_s:.1f} s" if result.startup_s is not None else ""
        parts.append(f"<h3>{e(label)}</h3><p>{e(summary)}{e(start)}</p>")
        for name, title in (("steps", "step time"), ("memory", "memory"), ("comm", "comm")):
            rows = [r for r in tables[name] if r["plan"] == label]
            if not rows:
                parts.append(f"<p>No {title} rows were recorded.</p>")
                continue
            cols = [c for c in rows[0] if c != "plan"]
            head = "".join(f"<th>{e(c)}</th>" for c in cols)
            body = "".join(
                "<tr>" + "".join(f"<td>{e(_fmt(r[c]))}</td>" for c in cols) + "</tr>" for r in rows
            )
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    parts.append("</section>")
    return "\n".join(parts)
