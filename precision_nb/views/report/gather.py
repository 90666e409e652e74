"""The report of a run gathered from its folder: the ranks' logs of every node, read after the run
(``precision-nb gather RUN_DIR --out DIR``).

:func:`gather_report` reads the folder with the engine's
:func:`~precision_nb.engine.distributed.gather.gather` and writes the report folder a distributed
run gets on one machine: metrics.csv and summary.csv of the rank-merged records, the figures,
hints, the plan's explanation, report.html and the "Distributed: per rank" section with its CSVs
(per node too when the run spanned several); no speedup (:data:`STEP_RULE` says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["gather_report", "gathered_comparison"]

#: How the step times of a gathered run were taken (shown with the report's method).
STEP_RULE = (
    "each logged interval's mean step time on every rank (the engine's records); a distributed "
    "step takes as long as its slowest rank, so the merged records take the slowest rank's; a "
    "training run, not an interleaved measurement: no warm-up is set apart and no speedup given"
)


def gathered_comparison(result: Any) -> tuple[str, Any]:
    """(label, a ``Comparison`` holding the run's rank-merged records) for the report."""
    from precision_nb.engine.comparison import Comparison, Drift, PlanOutcome
    from precision_nb.engine.distributed.measured import global_workload

    dplan = result.plan
    label = str(dplan.precision.plan.mode)
    comparison = Comparison()
    comparison.results[label] = result.run_result(
        label=label,
        device=dplan.rank_device,
        records=[{**r, "run": label} for r in result.records],
        workload=global_workload(result.rank0.get("workload", {}), len(result.ranks)),
    )
    comparison.outcomes[label] = PlanOutcome(label, comparison.results[label], drift=Drift())
    comparison.method = {"distributed step time": STEP_RULE}
    comparison.stopped = result.stopped
    return label, comparison


def _settings(run_dir: Path, result: Any) -> dict[str, Any]:
    nodes = result.node_table()
    startup = f"{result.startup_s:.1f} s" if result.startup_s is not None else "not recorded"
    return {
        "run folder": str(run_dir),
        "gathered from": (
            f"{len(result.ranks)} rank log(s) of {len(nodes)} node(s): "
            + "; ".join(f"node {n['node']} ({n['host']}): ranks {n['ranks']}" for n in nodes)
        ),
        "distributed": result.plan.summary(),
        "start-up": (
            f"{startup} from the first node's torchrun agent starting to the last rank entering "
            "its fit loop (host clocks of the nodes)"
        ),
    }


def gather_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    *,
    settings: Mapping[str, Any] | None = None,
) -> Any:
    """Gather the run folder ``run_dir`` into a ``Profile`` (the object ``profile()`` returns:
    it shows itself in a notebook) and, with ``out``, write its report folder.

    Raises like :func:`~precision_nb.engine.distributed.gather.gather`: ``ValueError`` for a
    folder without a run file or rank logs, ``DistributedError`` (naming the node and rank) for
    a run that failed, has not finished or lacks ranks.
    """
    from precision_nb.engine.distributed.gather import gather
    from precision_nb.views.report.hints import hints
    from precision_nb.views.report.profile_result import Profile
    from precision_nb.views.report.tables import summary

    folder = Path(run_dir)
    result = gather(folder)
    label, comparison = gathered_comparison(result)
    shown = {**_settings(folder, result), **(settings or {})}
    report = Profile(
        comparison,
        summary(comparison),
        tuple(hints(comparison)),
        shown,
        distributed={label: result},
    )
    if out is not None:
        report.save(out)
    return report
