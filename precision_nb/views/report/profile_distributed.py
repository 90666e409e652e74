"""A distributed profile's section: the per-rank step times, memory by kind and dtype and
communication bytes per step of the plans one torchrun launch measured
(:func:`~precision_nb.engine.distributed.measured.compare_distributed` gives the ``Comparison``
the rest of the report reads).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from precision_nb.views.report.markup import table_html
from precision_nb.views.report.sections import Section, csv_file

__all__ = [
    "TITLE",
    "distributed_body",
    "distributed_html",
    "distributed_section",
    "rank_step_table",
]


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


def distributed_section(runs: Mapping[str, Any]) -> Section:
    """The report's distributed section: its CSVs (the per-rank tables, and one row per node
    when a run spans several nodes) and their HTML (nothing written)."""
    import pandas as pd

    tables = _tables(runs)
    nodes = [
        {"plan": label, **row}
        for label, result in runs.items()
        if hasattr(result, "node_table")
        for row in result.node_table()
    ]
    if len({row["node"] for row in nodes}) > 1:  # a run over several nodes: one row per node
        tables["nodes"] = nodes
    files = tuple(
        csv_file(f"distributed_{name}.csv", pd.DataFrame(rows)) for name, rows in tables.items()
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
