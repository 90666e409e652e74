"""Every figure renders to PNG with the axes, labels, titles, log2 scale and skip markers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from precision_nb.views.report import figures as F

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _line_colors(ax) -> dict[str, str]:
    return {line.get_label(): to_hex(line.get_color()) for line in ax.get_lines()}


@pytest.mark.parametrize(
    "make",
    [F.loss_figure, F.loss_scale_figure, F.throughput_figure, F.memory_figure, F.dashboard_figure],
)
def test_every_figure_renders_to_png(make, three_plans):
    fig = make(three_plans)
    assert isinstance(fig, Figure)
    png = F.figure_to_png(fig)
    assert png.startswith(PNG_MAGIC)
    assert len(png) > 5_000
    for ax in fig.axes:
        assert ax.get_title()
        assert ax.get_ylabel()


def test_figures_never_touch_pyplot_state(three_plans):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    F.dashboard_figure(three_plans)
    assert plt.get_fignums() == before


def test_loss_figure_one_line_per_plan_with_labels(three_plans):
    ax = F.loss_figure(three_plans).axes[0]
    assert ax.get_xlabel() == "optimizer step"
    assert ax.get_ylabel() == "loss"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"fp32", "bf16", "fp16"}
    assert list(lines["bf16"].get_xdata()) == list(range(1, 11))
    assert lines["fp16"].get_ydata()[0] == pytest.approx(2.2 * 0.9048374, rel=1e-5)


def test_loss_line_never_jumps_at_a_step_that_skipped_attempts_share(make_records):
    records = make_records("fp16", "fp16", steps=4, use_scaler=True)
    early = [{**records[0], "step": 0, "loss": 9.0 + i} for i in range(3)]  # skipped attempts
    ax = F.loss_figure(early + records).axes[0]
    (line,) = ax.get_lines()
    xs = list(line.get_xdata())
    assert xs == [0, 1, 2, 3, 4] and line.get_ydata()[0] == 11.0  # the last record of step 0


def test_loss_scale_axis_is_log2_and_skips_are_marked(three_plans):
    ax = F.loss_scale_figure(three_plans).axes[0]
    assert ax.get_yscale() == "log"
    assert ax.yaxis.get_transform().base == 2
    assert "log2" in ax.get_ylabel()
    # Only the scaled plan draws a scale line.
    assert [line.get_label() for line in ax.get_lines()] == ["fp16"]
    markers = [c for c in ax.collections if c.get_label() == "skipped step (inf or NaN)"]
    assert len(markers) == 1
    offsets = markers[0].get_offsets()
    assert [tuple(p) for p in offsets] == [(3.0, 2.0**15), (7.0, 2.0**14)]


def test_loss_scale_uses_scale_history_when_given(three_plans):
    history = [
        {"step": 1, "attempt": 1, "loss_scale": 65536.0, "skipped": False},
        {"step": 1, "attempt": 2, "loss_scale": 32768.0, "skipped": True},
        {"step": 2, "attempt": 3, "loss_scale": 32768.0, "skipped": False},
    ]
    ax = F.loss_scale_figure(three_plans, histories={"fp16": history}).axes[0]
    assert "attempt" in ax.get_xlabel()
    markers = [c for c in ax.collections if c.get_label() == "skipped step (inf or NaN)"]
    assert [tuple(p) for p in markers[0].get_offsets()] == [(2.0, 32768.0)]


def test_loss_scale_without_scaler_says_so(make_records):
    ax = F.loss_scale_figure(make_records("fp32", "fp32")).axes[0]
    assert ax.get_yscale() == "log"
    assert not ax.get_lines()
    assert any("no plan uses a loss scaler" in t.get_text() for t in ax.texts)


def test_throughput_prefers_tokens_when_every_run_has_them(make_records, three_plans):
    ax = F.throughput_figure(three_plans).axes[0]
    assert ax.get_ylabel() == "throughput (samples/s)"
    tokens = make_records("fp32", "fp32", tokens=4096) + make_records("bf16", "bf16", tokens=4096)
    ax = F.throughput_figure(tokens).axes[0]
    assert ax.get_ylabel() == "throughput (tokens/s)"
    solid = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    assert solid[0].get_ydata()[0] == pytest.approx(4096 / 0.01)


def test_memory_bars_are_peaks_in_mib_labelled_by_kind(three_plans):
    ax = F.memory_figure(three_plans).axes[0]
    assert ax.get_ylabel() == "peak host RSS, the whole process (MiB)"
    assert "host RSS" in ax.get_title()
    heights = [p.get_height() for p in ax.patches]
    assert heights == pytest.approx([120.0, 80.0, 90.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "bf16", "fp16"]


def test_memory_kinds_are_never_mixed_on_one_axis(make_records):
    records = make_records("fp32", "fp32", memory_kind="cuda_allocated") + make_records(
        "fp32 host", "fp32", memory_kind="host_rss"
    )
    fig = F.memory_figure(records)
    assert len(fig.axes) == 2
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "peak CUDA allocated (MiB)",
        "peak host RSS, the whole process (MiB)",
    ]
    assert [len(ax.patches) for ax in fig.axes] == [1, 1]


def test_a_plan_keeps_its_colour_across_figures(three_plans):
    colors = F.plan_colors(three_plans)
    assert len(set(colors.values())) == 3
    loss = _line_colors(F.loss_figure(three_plans).axes[0])
    tput = _line_colors(F.throughput_figure(three_plans).axes[0])
    mem = F.memory_figure(three_plans).axes[0]
    bars = {
        t.get_text(): to_hex(p.get_facecolor())
        for t, p in zip(mem.get_xticklabels(), mem.patches, strict=True)
    }
    for label in ("fp32", "bf16", "fp16"):
        assert loss[label] == tput[label] == bars[label] == colors[label]
    # The same mode gets the same colour even when listed in another order or alone.
    assert F.plan_colors(["fp16"])["fp16"] == colors["fp16"]


def test_dashboard_is_two_by_two_with_all_four_views(three_plans):
    fig = F.dashboard_figure(three_plans)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 4
    assert titles[0].startswith("Training loss")
    assert titles[1].startswith("Loss scale")
    assert titles[2].startswith("Throughput")
    assert titles[3].startswith("Peak memory")
    assert fig.axes[1].get_yscale() == "log"
    assert "fp32, bf16, fp16" in fig.get_suptitle()


def test_without_a_scaler_the_dashboard_has_no_empty_loss_scale_panel(make_records):
    records = make_records("fp32", "fp32") + make_records("bf16", "bf16")
    assert not F.uses_loss_scale(records)
    fig = F.dashboard_figure(records)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 3 and not any(t.startswith("Loss scale") for t in titles)
    loss, throughput, _ = fig.axes
    assert titles[0].startswith("Training loss")
    # the loss spans the top row: as wide as the two panels below it together
    assert loss.get_position().width > 1.8 * throughput.get_position().width


def test_the_dashboard_shows_memory_by_kind_from_an_inspection(three_plans):
    from precision_nb.engine.inspect import memory as mem

    inspections = {
        label: SimpleNamespace(
            label=label,
            device="cpu",
            simulated=False,
            memory=[
                {"kind": mem.PARAMS, "dtype": "fp32", "bytes": 2**20, "counted": True},
                {"kind": mem.GRADS, "dtype": "fp32", "bytes": size, "counted": True},
            ],
        )
        for label, size in (("fp32", 2**20), ("bf16", 2**19), ("fp16", 2**19))
    }
    ax = F.dashboard_figure(three_plans, inspections=inspections).axes[-1]
    assert ax.get_title() == "Memory by kind (measured from the tensors)"
    assert [p.get_height() for p in ax.patches] == pytest.approx([1, 1, 1, 0.5, 1, 0.5])
    assert not any("RSS" in t.get_text() for t in ax.texts)


def test_figures_display_as_png_in_ipython_without_the_inline_backend(three_plans):
    from IPython.core.formatters import PNGFormatter

    fig = F.loss_figure(three_plans)
    png = PNGFormatter()(fig)  # a fresh formatter: nothing registered for Figure
    assert png is not None and png.startswith(PNG_MAGIC)


def test_unscaled_histories_do_not_change_the_x_axis(make_records):
    history = [{"step": 1, "attempt": 1, "loss_scale": None, "skipped": False}]
    ax = F.loss_scale_figure(make_records("fp32", "fp32"), histories={"fp32": history}).axes[0]
    assert ax.get_xlabel() == "optimizer step"
    assert any("no plan uses a loss scaler" in t.get_text() for t in ax.texts)
