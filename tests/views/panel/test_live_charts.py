"""The panel's live SVG charts: one line per run, log2 loss scale with skipped steps marked."""

from __future__ import annotations

import re

from precision_nb.views.panel.live_charts import MAX_POINTS, chart_svg, live_charts_html


def _records(run: str, n: int, *, skip_at: int | None = None) -> list[dict]:
    out = []
    for step in range(1, n + 1):
        out.append(
            {
                "run": run,
                "step": step,
                "loss": 2.0 / step,
                "loss_scale": 2.0 ** (16 - (1 if skip_at and step >= skip_at else 0)),
                "skipped": 1 if step == skip_at else 0,
                "samples_per_s": 100.0 * step,
                "tokens_per_s": None,
                "memory_kind": "host_rss",
                "memory_peak_bytes": 300 * 2**20 + step,
            }
        )
    return out


def test_four_charts_one_line_per_run_in_the_plan_colours():
    html = live_charts_html(_records("fp32", 10) + _records("fp16 <lab>", 10, skip_at=4))
    assert html.count("<svg") == 4
    assert html.count("<polyline") == 8  # 2 runs x 4 charts
    assert "samples/s" in html and "process memory MiB (host RSS)" in html
    assert "loss scale (log2" in html
    assert "fp16 &lt;lab&gt;" in html and "<lab>" not in html  # labels are escaped
    colours = set(re.findall(r"stroke='(#[0-9a-fA-F]{6})'", html))
    assert len(colours) == 2


def test_skipped_steps_are_marked_on_the_log2_scale():
    html = live_charts_html(_records("fp16", 10, skip_at=4))
    assert html.count("class='pnb-skip'") == 1
    assert "2^16" in html and "2^15" in html  # log2 axis ends


def test_long_runs_are_thinned_and_empty_input_draws_nothing():
    points = [(float(i), float(i)) for i in range(5000)]
    svg = chart_svg({"fp32": points}, {"fp32": "#1f77b4"}, title="loss")
    coords = re.search(r"points='([^']*)'", svg).group(1).split()
    assert len(coords) == MAX_POINTS
    assert live_charts_html([]) == ""
    assert "no data yet" in chart_svg({"fp32": []}, {}, title="loss")


def test_axis_labels_read_at_a_glance() -> None:
    flat = [(1.0, 65536.0), (2.0, 65536.0)]
    log2 = chart_svg({"fp16": flat}, {}, title="loss scale", log2=True)
    assert ">2^17<" in log2 and ">2^15<" in log2 and "2^16.5" not in log2  # whole powers of two
    rate = chart_svg({"fp32": [(1.0, 398.9), (2.0, 48_512.0)]}, {}, title="samples/s")
    assert ">48.5k<" in rate and "e+04" not in rate


def test_memory_is_drawn_from_zero_so_a_few_bytes_are_not_a_jump() -> None:
    records = [
        {"run": "fp32", "step": s, "memory_kind": "host_rss", "memory_peak_bytes": b}
        for s, b in ((1, 446 * 2**20), (2, 446 * 2**20 + 4096))
    ]
    memory = live_charts_html(records).split("<svg")[4]
    assert ">446<" in memory and ">0<" in memory
