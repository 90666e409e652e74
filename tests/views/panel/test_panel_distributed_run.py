"""Real distributed runs from the panel: 2 CPU ranks under torchrun (gloo), the kernel launching.

Two launches in all: one DDP run (shared by the tests through a module fixture) whose live
callback received rank 0's records while torchrun ran and whose per-rank view lists both ranks,
and one run whose rank 1 raises, shown in the panel's error area with the rank named.
"""

from __future__ import annotations

import html
from pathlib import Path

import psutil
import pytest

from precision_nb.core.distributed import Distributed
from precision_nb.engine.distributed import DistributedError, DistributedResult
from precision_nb.engine.results import RunResult
from precision_nb.views.panel import Panel
from precision_nb.views.panel.run import LiveCallback

ENGINE_TESTS = Path(__file__).resolve().parents[2] / "engine" / "distributed"
STEPS = 12
TIMEOUT = 300


def _torchrun_alive() -> bool:
    for child in psutil.Process().children(recursive=True):
        try:
            if "precision_nb.engine.distributed.torchrun" in " ".join(child.cmdline()):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


@pytest.fixture(scope="module")
def ddp_run():
    """One DDP run with a bf16 comm hook; every record the panel's live callback received, with
    whether torchrun was still running at that moment."""
    seen: list[tuple[dict, bool]] = []
    original = LiveCallback.on_log

    def on_log(self, record):
        seen.append((dict(record), _torchrun_alive()))
        return original(self, record)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LiveCallback, "on_log", on_log)
        panel = Panel(
            steps=STEPS,
            log_every=1,
            train_options={"measure_peak": False},
            distributed=Distributed("ddp", 2, comm_hook="bf16", timeout_s=TIMEOUT),
        )
        returned = panel.run(block=True, timeout=TIMEOUT)
    yield panel, returned, seen
    panel.close()


def test_the_run_button_path_returns_every_rank_and_merged_records(ddp_run) -> None:
    panel, returned, _seen = ddp_run
    assert isinstance(returned, DistributedResult)
    assert panel.distributed_result is returned
    assert [r.rank for r in returned.ranks] == [0, 1]
    assert isinstance(panel.result, RunResult)  # what the charts and the summary read
    assert panel.result.records == returned.records
    assert panel.error is None and panel.widgets.status.value.startswith("Finished")
    assert len(panel.records_frame) == len(returned.records) == STEPS
    assert not panel.widgets.run_button.disabled and not panel.running


def test_live_callback_followed_rank_0_while_the_ranks_ran(ddp_run) -> None:
    panel, returned, seen = ddp_run
    rank0 = returned.ranks[0].records
    assert [r["step"] for r, _alive in seen] == [r["step"] for r in rank0]
    assert [r["loss"] for r, _alive in seen] == [r["loss"] for r in rank0]  # rank 0's own
    assert any(alive for _r, alive in seen), "no record arrived while torchrun was running"
    assert panel.widgets.progress.value == panel.widgets.progress.max == STEPS
    assert "<svg" in panel.widgets.live_charts.value and "loss" in panel.widgets.live_charts.value
    assert "loss" in panel.widgets.live_metrics.value


def test_per_rank_view_lists_memory_comm_and_step_time_of_both_ranks(ddp_run) -> None:
    panel, returned, _seen = ddp_run
    tables = panel.rank_tables
    memory = tables["memory"]
    assert set(memory["rank"]) == {0, 1}
    assert set(memory["kind"]) == {"parameters", "gradients", "optimizer_state"}
    assert memory.to_dict("records") == returned.memory_table()
    comm = tables["comm"]
    all_reduce = comm[comm["op"] == "all_reduce"]
    assert set(all_reduce["rank"]) == {0, 1} and set(all_reduce["dtype"]) == {"bf16"}
    assert list(tables["steps"]["rank"]) == [0, 1]
    assert list(tables["steps"]["steps_timed"]) == [STEPS, STEPS]
    assert set(tables["steps"]["timing"]) == {"logged intervals"}

    shown = html.unescape(panel._controller.session.per_rank.html.value)
    assert panel._controller.session.per_rank.box.layout.display != "none"
    for rank in (0, 1):
        assert f">rank {rank}</text>" in shown  # one bar per rank in the memory chart
    assert "pnb-dist-memory" in shown and "pnb-dist-comm" in shown
    assert f"{returned.startup_s:.2f} s" in shown
    for method in ("counting layer", "read from the tensors", "interquartile range"):
        assert method in shown


def test_a_failing_rank_is_named_in_the_panel_which_stays_usable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ENGINE_TESTS))
    import dist_helpers

    panel = Panel(
        dist_helpers.plain(),
        "dist_helpers:batches",
        factory="dist_helpers:raise_on_rank1",
        steps=8,
        log_every=1,
        train_options={"measure_peak": False},
        distributed=Distributed("ddp", 2, timeout_s=TIMEOUT),
    )
    try:
        assert panel.error is None
        panel.widgets.run_button.click()
        assert panel.wait(TIMEOUT)
        assert isinstance(panel.last_exception, DistributedError)
        assert panel.last_exception.rank == 1
        assert "rank 1 raised ArithmeticError" in panel.error
        assert panel.widgets.progress.bar_style == "danger"
        kept = panel.distributed_result
        assert kept is panel.last_exception.result
        assert all(rank.records for rank in kept.ranks)  # the other rank's records are kept
        assert "Rank 1 failed" in panel._controller.session.per_rank.html.value
        assert not panel.widgets.run_button.disabled and panel.widgets.stop_button.disabled
        panel.set(strategy="none", mode="bf16")
        assert panel.error is None and panel.plan.mode == "bf16"
    finally:
        panel.close()
