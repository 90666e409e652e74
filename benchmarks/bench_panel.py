"""The panel's two speed targets, measured side by side in one process.

1. Live plan latency: the time from a control's value change (set on the widget, as the frontend
   does) until the plan, the explanation/matrix HTML, the badge, the buttons and the copy-as-code
   snippet are updated. Changes cycle over mode, dtype, device (real and simulated), fused AdamW
   and the loss-scale lab. Measured twice: as the panel runs (explanations cached per selection)
   and with the cache emptied before every change (the full resolution each time).
   Target: median < 50 ms.

2. Plotting overhead: the same training run (workload, preset, steps, plan, seed) timed with
   ``fit()`` directly and with ``Panel.run(block=True)`` (progress, live metrics, live charts,
   budgeted matplotlib frames, and after the run the final charts, the summary table and the
   matplotlib figure when it fits the plotting budget, and the Memory/Ops/Numerics inspections
   when they fit it too). Runs are interleaved (plain, panel,
   plain, ...) after one warm-up of each (imports, FLOP count, CPU peak calibration: once per
   session, not per run) and medians compared. Target: panel / plain < 1.05. Because wall-clock
   ratios are noisy on a shared machine, the panel run also accounts for its own cost (time
   inside the engine callbacks plus what it draws after the run) against its training time.

    python benchmarks/bench_panel.py                       # mlp small, 300 steps, fp32
    python benchmarks/bench_panel.py --quick               # fewer changes, shorter run
    python benchmarks/bench_panel.py --workload transformer --preset tiny --steps 400
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time
from typing import Any

from precision_nb.engine.entry import fit
from precision_nb.views.panel import Panel

CHANGES: list[tuple[str, Any]] = [
    ("mode", "bf16"),
    ("mode", "fp16"),
    ("loss_scale_lab", True),
    ("mode", "fp32"),
    ("mode", "auto"),
    ("dtype", "bf16"),
    ("dtype", "fp16"),
    ("dtype", "none"),
    ("device", "sim:cuda-bf16"),
    ("device", "sim:cuda-no-bf16"),
    ("device", "sim:mps"),
    ("device", "cpu"),
    ("fused", "on"),
    ("fused", "off"),
    ("fused", "probe"),
    ("loss_scale_lab", False),
]


def plan_latency(panel: Panel, changes: int, cached: bool) -> list[float]:
    """Seconds per control change, from the widget's value set to the refreshed views."""
    widgets = panel.widgets
    cache = panel._controller.resolver.cache  # the panel's own cache of resolved selections
    times: list[float] = []
    for name, value in itertools.islice(itertools.cycle(CHANGES), changes):
        widget = getattr(widgets, name)
        if widget.value == value:
            continue
        if not cached:
            cache.clear()
        start = time.perf_counter()
        widget.value = value  # observers run synchronously, as in the kernel
        times.append(time.perf_counter() - start)
        assert panel.explanation is not None and widgets.plan_html.value
    return times


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--mode", default="fp32")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--changes", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="120 changes, 100 steps, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.changes, args.steps, args.repeats = 120, 100, 1

    panel = Panel(workload=args.workload, preset=args.preset, mode=args.mode, steps=args.steps)
    plan_latency(panel, len(CHANGES) * 2, cached=False)  # warm-up: imports, first probes
    panel.set(device="cpu", mode="auto", dtype=None, fused=None, loss_scale_lab=False)

    print("== live plan latency (control change -> plan, matrix, badge, code updated)")
    for cached in (True, False):
        times = plan_latency(panel, args.changes, cached)
        label = "as used (cache)" if cached else "cache emptied"
        print(
            f"{label:<16} n={len(times):4d}  median {ms(times, 0.5):6.2f} ms  "
            f"p95 {ms(times, 0.95):6.2f} ms  max {1000 * max(times):6.2f} ms  (target < 50 ms)"
        )

    print(
        f"\n== plotting overhead: {args.workload}/{args.preset}, {args.mode}, {args.steps} steps, "
        f"{args.repeats} interleaved repeat(s)"
    )
    panel.set(device="auto", mode=args.mode, dtype=None, fused=None, loss_scale_lab=False)
    log_every = max(1, args.steps // 50)  # what the panel uses for this many steps

    def plain() -> float:
        # In a worker thread, as the panel trains: torch's CPU speed can differ between the main
        # thread and others (measured 3-7x on a loaded 2-core machine), so like is compared
        # with like and only the panel's own work differs.
        def train() -> None:
            fit(
                args.workload,
                preset=args.preset,
                precision=args.mode,
                steps=args.steps,
                log_every=log_every,
                seed=0,
                progress=False,
            )

        start = time.perf_counter()
        worker = threading.Thread(target=train)
        worker.start()
        worker.join()
        return time.perf_counter() - start

    def with_panel() -> tuple[float, dict[str, float]]:
        start = time.perf_counter()
        result = panel.run(block=True)
        wall = time.perf_counter() - start
        spent = panel.timings
        training = result.seconds - spent.callbacks_s
        return wall, {
            "frames": spent.live_frames,
            "live_plot": spent.live_plot_s,
            "callbacks": spent.callbacks_s,
            "final": spent.final_render_s,
            "inspect": spent.inspect_s,
            "figure": 1.0 if panel.widgets.figure_image.value else 0.0,
            "training": training,
            "live_share": spent.callbacks_s / training,
            "share": (spent.callbacks_s + spent.final_render_s + spent.inspect_s) / training,
        }

    plain()  # warm-up: optimizer imports, FLOP count, CPU peak calibration
    with_panel()  # warm-up: the panel's first run imports pandas and draws its first charts
    plain_times: list[float] = []
    panel_times: list[float] = []
    costs: list[dict[str, float]] = []
    for _ in range(args.repeats):
        plain_times.append(plain())
        seconds, cost = with_panel()
        panel_times.append(seconds)
        costs.append(cost)
    p, q = statistics.median(plain_times), statistics.median(panel_times)

    def med(key: str) -> float:
        return statistics.median(c[key] for c in costs)

    runs = ", ".join(f"{t:.2f}" for t in plain_times)
    print(f"fit() alone          median {p:7.2f} s   ({runs})")
    runs = ", ".join(f"{t:.2f}" for t in panel_times)
    print(f"Panel.run(block)     median {q:7.2f} s   ({runs})")
    print(
        f"ratio panel / plain  {q / p:.3f}   (target < 1.05; wall clock, noisy on a busy machine)"
    )
    print(
        f"inside the panel run: training {med('training'):.2f} s; during training the panel "
        f"spent {med('callbacks'):.2f} s ({med('frames'):g} live frame(s), "
        f"{med('live_plot'):.2f} s plotting); after it, final charts + table"
        f"{' + figure' if med('figure') else ''} {med('final'):.2f} s, inspections "
        f"{med('inspect'):.2f} s"
    )
    print(f"panel share while training    {100 * med('live_share'):5.1f} %   (target < 5 %)")
    print(f"panel share incl. after run   {100 * med('share'):5.1f} %   (target < 5 %)")


if __name__ == "__main__":
    main()
