"""Distributed runs from the panel: what can reach torchrun's workers, the run itself, and the
per-rank view after it.

The notebook kernel is the launcher, never a rank: :func:`fit_target` calls ``fit_distributed``
in the panel's worker thread with the panel's engine callback (it receives rank 0's records as
they are logged, so the progress, live numbers and live charts follow rank 0) and the job's stop
event (Stop ends every rank between steps). :class:`DistributedView` keeps the
``DistributedResult`` (a failed run's too: every rank's records so far), hands the rest of the
panel its rank-merged records as a ``RunResult``, and shows per rank: step time and final loss,
memory by kind and dtype (table and bars), communication bytes per step by op and dtype, and the
start-up time, each with how it was measured.
"""

from __future__ import annotations

import html
import statistics
import tempfile
from typing import Any

import ipywidgets as widgets

from precision_nb.views.panel.analysis_html import stacked_bars_svg
from precision_nb.views.panel.results import note_html, table_html

__all__ = ["DistributedView", "as_run_result", "check_reachable", "fit_target", "user_inputs"]

_STEP_NOTE = (
    "step time: each rank's median over its logged intervals with the interquartile range "
    "(single-run figures: no interval, no verdict); the merged records (charts, summary) take "
    "the slowest rank's time per interval. final loss: the rank's loss on its own slice at its "
    "last logged step; the merged loss is the mean over ranks."
)
_MEMORY_NOTE = (
    "bytes read from the tensors each rank holds: parameters and optimizer state after the run, "
    "gradients at the first optimizer step; FSDP2: the rank's local shards, DDP: full replicas. "
    "DDP's bucket buffers, autocast copies and activations are not included."
)
_COMM_NOTE = (
    "bytes from the counting layer: every collective each rank issued, the full buffer of each "
    "call, mean per optimizer step over the logged steps; collectives before the first step "
    "(setup) are left out. In flight: host clock from each call to its work's completion, "
    "summed per step; collectives overlap compute and wait for the slowest rank, so this is how "
    "long communication was under way, not time added to the step; 'timed' is the share of "
    "calls whose completion could be observed (none: not measured)."
)


def _in_flight(seconds: float | None) -> str:
    return "not measured" if seconds is None else f"{seconds * 1e3:.2f}"


def _share(share: float | None) -> str:
    return "" if share is None else f"{share:.0%}"


_STARTUP_NOTE = (
    "wall clock from launching torchrun to the last rank entering its training loop (one run; "
    "mostly imports, longer on a busy machine)"
)


def _import(name: str, path: str, call: bool) -> Any:
    from precision_nb.engine.distributed.rank import import_path

    try:
        obj = import_path(path)
        return obj() if call else obj
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(
            f"{name}: {path!r} cannot be imported here ({type(exc).__name__}: {exc}); allowed: "
            "'package.module:function' importable by this kernel and the workers"
        ) from None


def user_inputs(batches: Any, loss_fn: Any) -> tuple[Any, str | None, Any, str | None]:
    """``(batches, batches_path, loss_fn, loss_fn_path)``: an import path is resolved here (the
    batches function called) for single-process runs and kept for torchrun's workers."""
    batches_path = batches if isinstance(batches, str) else None
    if batches_path is not None:
        batches = _import("batches", batches_path, call=True)
    loss_path = loss_fn if isinstance(loss_fn, str) else None
    if loss_path is not None:
        loss_fn = _import("loss_fn", loss_path, call=False)
    return batches, batches_path, loss_fn, loss_path


def check_reachable(user: Any, selection: Any, plan: Any) -> None:
    """``ValueError`` (the library's words where it has them) unless the model reaches the
    workers and the global batch splits into ``plan.nproc`` equal slices."""
    from precision_nb.engine.distributed.parallel import batch_samples, check_divisible

    if user is None:
        from precision_nb.engine.workloads import get_workload

        info = get_workload(selection.workload, selection.preset).info
        where = f"workload {selection.workload!r} at preset {selection.preset!r}"
        check_divisible(info["batch_size"], plan.nproc, where)
        return
    if user.factory is None:
        from precision_nb.engine.distributed.launcher import write_spec

        with tempfile.TemporaryDirectory(prefix="precision_nb_check_") as folder:
            write_spec(
                user.model, user.batches_path, distributed=plan.request, device="cpu",
                precision=plan.precision.config, run_dir=folder,
            )  # fmt: skip
        return  # pragma: no cover - write_spec refuses a model object without a factory
    if user.batches_path is None:
        raise ValueError(
            f"batches: a {type(user.batches).__name__} cannot reach torchrun workers; allowed: "
            "Panel(model, batches='package.module:function', factory='package.module:factory') "
            "(the function returns the global batches: an iterable or a callable taking the "
            "microbatch index)"
        )
    if user.loss_fn is not None and user.loss_fn_path is None:
        raise ValueError(
            f"loss_fn: a {type(user.loss_fn).__name__} cannot reach torchrun workers; allowed: "
            "None or 'package.module:function'"
        )
    _import("factory", user.factory, call=False)
    from precision_nb.engine.batches import BatchSource

    first = BatchSource(user.batches).get(0)
    check_divisible(batch_samples(first), plan.nproc, f"the first batch of {user.batches_path!r}")


def fit_target(session: Any, selection: Any, explanation: Any, plan: Any, live: Any, stop: Any):
    """The worker thread's run: the panel's run request launched on torchrun's workers (as
    ``fit_distributed`` does), followed by the panel's callback."""
    from precision_nb.engine.distributed.launcher import launch

    request = session.request(selection, [explanation.config], distributed=True)
    user = session.user_model
    factory = user.factory if user is not None else None
    return launch(request, plan.request, factory=factory, callbacks=[live], stop=stop)


def as_run_result(result: Any) -> Any:
    """The rank-merged records of a ``DistributedResult`` as a ``RunResult`` (rank 0's scale
    history, events and training seconds: start-up apart), which the panel's charts, summary,
    status line, figures and plotting budget read."""
    from precision_nb.core.events import Event

    rank0 = result.rank0
    startup = result.startup_s or 0.0  # the training seconds leave the start-up out
    events = [
        Event(e["kind"], e["message"], e.get("data") or {})
        for e in rank0.get("events", [])
        if isinstance(e, dict) and "kind" in e and "message" in e
    ]
    return result.run_result(
        events=events,
        seconds=float(rank0.get("seconds") or max(0.0, result.seconds - startup)),
    )


def _seconds(value: Any) -> str:
    return "n/a" if value is None or value != value else f"{value:.4g}"


class DistributedView:
    """The per-rank view (``box``, hidden until a distributed run ends) and its result."""

    def __init__(self) -> None:
        self.html = widgets.HTML()
        self.box = widgets.VBox([self.html], layout=widgets.Layout(display="none"))
        self.html.add_class("pnb-dist-ranks")
        self.result: Any = None

    def clear(self) -> None:
        self.result = None
        self.html.value = ""
        self.box.layout.display = "none"

    def take(self, source: Any, error: BaseException | None = None) -> Any:
        """Keep a ``DistributedResult`` and show it (``error``: what the run raised); returns
        what the rest of the panel shows: its rank-merged ``RunResult`` (else ``source``)."""
        from precision_nb.engine.distributed.results import DistributedResult

        if not isinstance(source, DistributedResult):
            self.clear()
            return source
        self.result = source
        self.html.value = self.render(source, getattr(error, "rank", None))
        self.box.layout.display = None
        return as_run_result(source) if source.records else None

    def tables(self) -> dict[str, Any]:
        """``steps``, ``memory``, ``comm``: the per-rank tables as DataFrames (empty before a
        distributed run)."""
        import pandas as pd

        result = self.result
        if result is None:
            return {}
        from precision_nb.views.report.profile_distributed import rank_step_table

        steps = [{k: v for k, v in r.items() if k != "plan"} for r in rank_step_table("", result)]
        return {
            "steps": pd.DataFrame(steps),
            "memory": pd.DataFrame(result.memory_table()),
            "comm": pd.DataFrame(result.comm_table()),
        }

    def render(self, result: Any, failed_rank: int | None) -> str:
        e = html.escape
        tables = self.tables()
        out = [f"<h4>Distributed run, per rank</h4><p>{e(result.plan.summary())}</p>"]
        if failed_rank is not None:
            out.append(
                f"<p class='pnb-dist-failed'><b>Rank {failed_rank} failed</b> (its error is in "
                "the message above); every rank's records written so far are kept below.</p>"
            )
        start = (
            "not reached by every rank" if result.startup_s is None else f"{result.startup_s:.2f} s"
        )
        out.append(f"<p><b>Start-up:</b> {e(start)} <i>({e(_STARTUP_NOTE)})</i></p>")
        times = [r["step_time_s"] for r in result.records if r.get("step_time_s")]
        if times:
            q = statistics.quantiles(times, n=4) if len(times) >= 2 else [float("nan")] * 3
            out.append(
                f"<p><b>Step time (slowest rank per interval):</b> median "
                f"{_seconds(statistics.median(times))} s, IQR {_seconds(q[2] - q[0])} s over "
                f"{len(times)} logged interval(s)</p>"
            )
        rows = [
            [str(r["rank"]), str(r["steps_timed"]), _seconds(r["median_step_time_s"]),
             _seconds(r["step_time_iqr_s"]), _seconds(r["final_loss"])]
            for r in tables["steps"].to_dict("records")
        ]  # fmt: skip
        head = ["rank", "logged intervals timed", "median step time (s)", "IQR (s)", "final loss"]
        out += ["<b>Step time and final loss</b>", table_html(head, rows, css="pnb-dist-steps")]
        out.append(note_html(_STEP_NOTE))
        out.append(self._memory_html(result))
        comm = result.comm_table()
        out.append("<b>Communication per optimizer step</b>")
        if comm:
            rows = [
                [str(r["rank"]), r["op"], r["dtype"], f"{r['bytes_per_step']:,.0f}",
                 _in_flight(r.get("in_flight_s_per_step")), _share(r.get("timed_share"))]
                for r in comm
            ]  # fmt: skip
            head = ["rank", "op", "dtype", "bytes per step", "in flight per step (ms)", "timed"]
            out.append(table_html(head, rows, css="pnb-dist-comm"))
        else:
            counted = getattr(result.plan.request, "count_collectives", True)
            text = "none counted" if counted else "not counted (count_collectives=False)"
            out.append(f"<p>{text}</p>")
        out.append(note_html(_COMM_NOTE))
        return "".join(out)

    @staticmethod
    def _memory_html(result: Any) -> str:
        rows = result.memory_table()
        if not rows:
            return "<b>Memory by rank</b><p>no rank reported its memory (it ended before).</p>"
        bars: dict[str, list[tuple[str, str, int]]] = {}
        for r in rows:
            kind = str(r["kind"]).replace("_", " ")
            bars.setdefault(f"rank {r['rank']}", []).append(
                (kind, str(r["dtype"]), int(r["bytes"]))
            )
        table = table_html(
            ["rank", "kind", "dtype", "bytes", "MiB"],
            [
                [str(r["rank"]), str(r["kind"]), str(r["dtype"]), f"{r['bytes']:,}",
                 f"{r['bytes'] / 2**20:.3f}"]
                for r in rows
            ],
            css="pnb-dist-memory",
        )  # fmt: skip
        svg = stacked_bars_svg(bars, css="pnb-dist-memory-chart")
        return f"<b>Memory by rank, kind and dtype</b>{svg}{table}" + note_html(_MEMORY_NOTE)
