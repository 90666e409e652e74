"""Panel runs, headless: Run / Compare / Stop by Button.click(), refusal of a second run, the
plotting budget, live-update throttling. Tiny workloads, a few steps each."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from precision_nb.views.panel import Panel
from precision_nb.views.panel.run import LiveCallback
from precision_nb.views.panel.session import figure_fits_budget
from precision_nb.views.report.figures import figure_to_png

PNG = b"\x89PNG\r\n\x1a\n"
TIMEOUT = 120


def _wait_until(predicate, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def finished() -> tuple[Panel, dict]:
    """A panel after one 5-step bf16 run started by its Run button, with what it showed then."""
    panel = Panel(steps=5, log_every=1, mode="bf16")
    panel.widgets.run_button.click()
    during = {
        "running": panel.running,
        "run_disabled": panel.widgets.run_button.disabled,
        "stop_enabled": not panel.widgets.stop_button.disabled,
    }
    assert panel.wait(TIMEOUT)
    after = {
        "image": bytes(panel.widgets.figure_image.value),
        "image_display": panel.widgets.figure_image.layout.display,
        "note": panel.widgets.figure_note.value,
    }
    yield panel, {"during": during, "after": after}
    panel.close()


def test_run_button_disables_run_and_enables_stop_while_running(finished) -> None:
    panel, seen = finished
    assert seen["during"] == {"running": True, "run_disabled": True, "stop_enabled": True}
    assert (
        not panel.running
        and not panel.widgets.run_button.disabled
        and panel.widgets.stop_button.disabled
    )
    assert panel.error is None, panel.error


def test_run_keeps_every_record_of_the_selected_plan(finished) -> None:
    panel, _ = finished
    assert panel.result.steps == 5 and not panel.result.stopped
    frame = panel.records_frame
    assert list(frame["step"]) == [1, 2, 3, 4, 5]
    assert set(frame["mode"]) == {"bf16"} and set(frame["run"]) == {"bf16"}
    assert len(panel.summary) == 1


def test_progress_and_status_reach_the_end(finished) -> None:
    panel, _ = finished
    assert panel.widgets.progress.value == panel.widgets.progress.max == 5
    assert panel.widgets.progress_label.value.startswith("5/5 steps")
    assert "steps/s" in panel.widgets.progress_label.value
    assert panel.widgets.progress.bar_style == "success"
    assert "Finished: 1 run(s) (bf16), last logged step 5" in panel.widgets.status.value
    assert (
        "<table" in panel.widgets.results_html.value and "bf16" in panel.widgets.results_html.value
    )


def test_live_numbers_and_svg_charts_show_the_run(finished) -> None:
    panel, _ = finished
    assert (
        "loss" in panel.widgets.live_metrics.value
        and "samples/s" in panel.widgets.live_metrics.value
    )
    charts = panel.widgets.live_charts.value
    assert charts.count("<svg") == 4
    # loss, throughput, memory; bf16 has no loss scaler, and its chart says so
    assert charts.count("<polyline") == 3 and "no loss scaler" in charts


def test_figures_are_fresh_matplotlib_figures_of_every_record(finished) -> None:
    panel, _ = finished
    figures = panel.figures
    assert set(figures) == {"loss", "loss_scale", "throughput", "memory", "dashboard"}
    assert all(fig.axes for fig in figures.values())
    loss_lines = figures["loss"].axes[0].get_lines()
    assert len(loss_lines) == 1 and list(loss_lines[0].get_xdata()) == [1, 2, 3, 4, 5]
    assert figure_to_png(figures["loss"], dpi=40).startswith(PNG)
    assert panel.figures["loss"] is not figures["loss"]  # fresh each time


def test_first_short_run_leaves_the_figure_to_draw_figure(finished) -> None:
    # before any frame was drawn, a frame is guessed to cost a second: far over 2.5 % of a
    # 5-step run, so the figure waits for the button, and the note says so
    panel, seen = finished
    assert seen["after"]["image"] == b"" and seen["after"]["image_display"] == "none"
    assert "not drawn" in seen["after"]["note"] and "Draw figure" in seen["after"]["note"]
    assert not panel.widgets.figure_button.disabled


def test_draw_figure_button_draws_the_png(finished) -> None:
    panel, _ = finished
    panel.widgets.figure_button.click()
    assert (
        bytes(panel.widgets.figure_image.value).startswith(PNG)
        and len(panel.widgets.figure_image.value) > 2000
    )
    assert (
        panel.widgets.figure_image.layout.display is None and panel.widgets.figure_note.value == ""
    )
    assert panel.error is None


def test_a_live_frame_is_drawn_from_the_records_so_far(finished) -> None:
    panel, _ = finished
    result = panel.result
    panel._controller.session._draw_live(result.records[:3], [result])
    assert bytes(panel.widgets.figure_image.value).startswith(PNG)
    assert "Live figure" in panel.widgets.figure_note.value


def test_second_run_is_refused_and_stop_keeps_every_record() -> None:
    panel = Panel(steps=100_000, log_every=1)
    panel.widgets.run_button.click()
    _wait_until(lambda: panel.widgets.progress.value >= 3)
    assert panel.widgets.run_button.disabled and panel.widgets.compare_button.disabled
    # a second Run: the button is disabled, and the guard refuses a click or a call anyway
    first_job = panel._controller.session.job
    panel.widgets.run_button.click()
    assert panel._controller.session.job is first_job
    assert "already going" in panel.widgets.status.value
    with pytest.raises(RuntimeError, match="already going"):
        panel.run()
    with pytest.raises(RuntimeError, match="already going"):
        panel.compare()
    assert len(panel.records_frame) >= 3  # live records are readable while running

    panel.widgets.stop_button.click()
    assert panel.wait(TIMEOUT)
    result = panel.result
    assert result.stopped and 3 <= result.steps < 100_000
    assert len(panel.records_frame) == result.steps == len(result.records)
    assert any(e.kind == "stop" and "stopped by request" in e.message for e in result.events)
    assert (
        "Stopped" in panel.widgets.status.value
        and "stopped by request" in panel.widgets.events_html.value
    )
    # the header's progress line says the run stopped (it would read as a run still going)
    assert panel.widgets.progress_label.value.startswith(f"stopped: {result.steps}/100000 steps")
    assert panel.draw_figure().startswith(PNG)  # a stopped run's records draw too
    assert not panel.widgets.run_button.disabled and panel.widgets.stop_button.disabled
    assert panel.error is None


def test_compare_overlays_plans_with_summary_table() -> None:
    panel = Panel(
        steps=4, log_every=1, compare_plans=("fp32", "bf16", "fp16 + loss-scale lab"), budget=1
    )
    panel.widgets.compare_button.click()
    assert panel.wait(TIMEOUT)
    assert panel.error is None, panel.error
    comparison = panel.result
    labels = list(comparison.results)
    assert labels == ["fp32", "bf16", "fp16 (loss-scale lab)"]
    assert list(dict.fromkeys(panel.records_frame["run"])) == labels
    table = panel.summary
    assert list(table["run"]) == labels
    lab = table.set_index("run").loc["fp16 (loss-scale lab)"]
    assert bool(lab["use_scaler"]) and lab["mode"] == "fp16"
    # same seed and data: the fp32 reference has zero drift, the others are measured
    assert comparison.drift["fp32"]["param_rel_diff"] == 0.0
    assert comparison.drift["bf16"]["param_rel_diff"] > 0.0
    assert all(label in panel.widgets.results_html.value for label in labels)
    panel.widgets.figure_button.click()
    assert bytes(panel.widgets.figure_image.value).startswith(PNG)
    assert panel.widgets.progress.value == panel.widgets.progress.max
    # overlaid live charts: 3 lines per run, plus the lab's loss scale
    assert panel.widgets.live_charts.value.count("<polyline") == 3 * len(labels) + 1


def test_figure_fits_budget_counts_every_plotted_second() -> None:
    # 2.5 % of 100 s is 2.5 s of plotting in all
    assert figure_fits_budget(training_s=100.0, plotted_s=0.0, cost_s=2.5, budget=0.025)
    assert not figure_fits_budget(training_s=100.0, plotted_s=0.0, cost_s=2.6, budget=0.025)
    assert not figure_fits_budget(training_s=100.0, plotted_s=2.0, cost_s=1.0, budget=0.025)
    assert not figure_fits_budget(training_s=0.0, plotted_s=0.0, cost_s=0.001, budget=0.5)


def test_figure_is_drawn_when_frames_are_cheap_and_the_cost_is_learnt() -> None:
    panel = Panel(steps=3, log_every=1)
    with pytest.raises(RuntimeError, match="no run yet"):
        panel.draw_figure()
    assert panel.widgets.figure_button.disabled  # nothing to draw before a run
    panel._controller.session.frame_cost_s = (
        0.0  # as if frames were free here: frames fit the budget
    )
    panel.run(block=True, timeout=TIMEOUT)
    # drawn live during the run or at its end, whichever the budget allowed first
    assert bytes(panel.widgets.figure_image.value).startswith(PNG)
    assert panel.timings.live_frames >= 1 or panel.widgets.figure_note.value == ""
    assert panel._controller.session.frame_cost_s > 0.0  # the real cost of a drawn frame is learnt
    # that cost is far over 2.5 % of a 3-step run: the next run leaves the figure to the button
    panel.run(block=True, timeout=TIMEOUT)
    assert (
        panel.widgets.figure_image.value == b"" and "not drawn" in panel.widgets.figure_note.value
    )
    panel.close()


def test_an_over_budget_final_figure_keeps_the_last_live_frame() -> None:
    from types import SimpleNamespace

    panel = Panel(steps=3, log_every=1)
    result = panel.run(block=True, timeout=TIMEOUT)
    panel._controller.session._draw_live(result.records, [result])
    live_frame = bytes(panel.widgets.figure_image.value)
    assert live_frame.startswith(PNG)
    busy = SimpleNamespace(callback_seconds=0.0, plot_seconds=1.0, frames=1)  # budget spent
    panel._controller.session._final_figure(busy, panel.records_frame)
    assert bytes(panel.widgets.figure_image.value) == live_frame
    assert "last live frame" in panel.widgets.figure_note.value
    # a new run clears the previous figure; while it goes, drawing is refused
    panel.set(steps=100_000)
    panel.run()
    assert panel.widgets.figure_image.value == b"" and panel.widgets.figure_button.disabled
    with pytest.raises(RuntimeError, match="a run is going"):
        panel.draw_figure()
    panel.stop()
    assert panel.wait(TIMEOUT)


def test_compare_with_no_plan_ticked_says_so() -> None:
    panel = Panel(steps=2)
    panel.widgets.compare_plans.value = ()  # the user unticked everything
    panel.widgets.compare_button.click()
    assert not panel.running and "at least one plan" in panel.error
    with pytest.raises(ValueError, match=r"compare_plans=\(\) is empty"):
        panel.compare()


def test_user_model_is_trained_on_a_copy() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    before = [p.detach().clone() for p in model.parameters()]
    batches = [(torch.randn(6, 8), torch.randint(0, 3, (6,))) for _ in range(4)]
    panel = Panel(model, batches, steps=3, log_every=1)
    result = panel.run(block=True)
    assert result.steps == 3 and len(panel.records_frame) == 3
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_user_loss_fn_is_used_by_run_and_compare() -> None:
    calls: list[str] = []

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        calls.append("called")
        return nn.functional.mse_loss(output.float(), target)

    model = nn.Linear(4, 1)
    batches = [(torch.randn(5, 4), torch.randn(5, 1)) for _ in range(2)]
    panel = Panel(
        model, batches, loss_fn=loss_fn, steps=2, compare_plans=("fp32", "bf16"), budget=1
    )
    panel.run(block=True)
    after_run = len(calls)
    assert after_run >= 2
    comparison = panel.compare(block=True)
    assert list(comparison.results) == ["fp32", "bf16"]
    assert len(calls) >= after_run + 4


def test_live_callback_survives_a_failing_frame() -> None:
    clock = _Clock()

    def draw(records, results) -> None:
        raise RuntimeError("no display")

    live = LiveCallback(
        steps=10,
        runs=1,
        progress=lambda *a: None,
        draw=draw,
        budget=0.5,
        min_interval_s=0.0,
        first_cost_guess_s=0.0,
        clock=clock,
    )
    for step in range(1, 11):
        clock.now += 1.0
        live.on_log({"step": step})
    assert live.draw_error == "RuntimeError: no display"
    assert len(live.records) == 10 and live.frames == 1  # tried once, then no more frames


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_live_callback_keeps_plotting_within_budget_and_rate() -> None:
    clock = _Clock()
    draws: list[float] = []
    progress: list[tuple[int, int, str]] = []

    def draw(records, results) -> None:
        draws.append(clock.now)
        clock.now += 0.4  # an expensive frame

    live = LiveCallback(
        steps=1000,
        runs=1,
        progress=lambda d, t, s, r: progress.append((d, t, s)),
        draw=draw,
        budget=0.05,
        min_interval_s=0.5,
        clock=clock,
    )

    class _Result:
        label = "fp32"
        records: list = []
        scale_history: list = []

    live.on_fit_start(_Result())
    for step in range(1, 1001):
        clock.now += 0.02  # 20 ms of training per step
        live.on_log({"step": step, "step_time_s": 0.02})
        training = clock.now - live.plot_seconds
        assert live.plot_seconds <= 0.05 * training + 1e-9
    assert live.frames == len(draws) >= 2  # some live frames, not one per step
    assert all(b - a >= 0.5 for a, b in zip(draws, draws[1:], strict=False))
    assert progress[-1][0] <= 1000 and progress[-1][1] == 1000
    assert len(progress) < 1000  # progress is throttled too
    assert "steps/s" in progress[-1][2]


def test_live_callback_rejects_bad_budget() -> None:
    with pytest.raises(ValueError, match="budget=1.5"):
        LiveCallback(steps=1, runs=1, progress=print, draw=print, budget=1.5)


def test_the_status_line_fits_one_line_and_names_the_runs_while_they_fit():
    from precision_nb.views.panel.outputs import STATUS_WIDTH, status_line

    short = status_line("Finished", ["fp32", "bf16"], 20, 3.2, 40)
    assert short == (
        "Finished: 2 run(s) (fp32, bf16), last logged step 20, 3.2 s of training, 40 records kept."
    )
    runs = ["fp32", "bf16", "fp16", "bf16+compile", "fp16+compile"]
    long = status_line("Interrupted", runs, 20_000, 1234.5, 1_000_000)
    assert len(long) <= STATUS_WIDTH and long.startswith("Interrupted: 5 run(s), last logged")
    assert "1,000,000 records kept" in long
