"""What an inspection costs: ``run_inspection`` beside a plain training step of the same workload.

For each plan, one repeat times a plain step (forward, backward, AdamW step on the model under
the plan's autocast, the median of a few steps) and then one inspection of the same model
(deep copy, instrumented step with the op trace and saved-tensor hooks, memory rows). The ratio
is inspection / plain step within each repeat (paired, so machine drift cancels); the median and
interquartile range over repeats are printed.

The first inspection of a process also pays one-off imports (torch builds its optimizer and
dispatch machinery lazily); it is printed on its own as "first", after one plain step has run.

    python benchmarks/bench_inspect.py            # the default workload, fp32 + bf16
    python benchmarks/bench_inspect.py --quick    # fewer repeats (a smoke run)

Target: one inspection of the default workload under 2 s (exit 1 on a miss).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

from precision_nb.core.amp import autocast_context
from precision_nb.core.resolution import resolve_precision
from precision_nb.engine.batches import output_to_loss, split_batch
from precision_nb.engine.inspect import run_inspection
from precision_nb.engine.workloads import DEFAULT_PRESET, DEFAULT_WORKLOAD, get_workload

TARGET_S = 2.0


def plain_step(model: torch.nn.Module, batch: Any, plan: Any, opt: Any, steps: int = 3) -> float:
    """Median seconds of ``steps`` plain training steps (after the caller's warm-up)."""
    times = []
    args, kwargs, labels = split_batch(batch, model)
    for _ in range(steps):
        t0 = time.perf_counter()
        with autocast_context(plan):
            loss, _ = output_to_loss(model(*args, **kwargs), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(workload: str, preset: str, mode: str, repeats: int) -> dict[str, Any]:
    wl = get_workload(workload, preset)
    torch.manual_seed(0)
    model = wl.make_model()
    batches = wl.make_batches("cpu")
    plan = resolve_precision(mode, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plain_step(model, batches(0), plan, opt, steps=2)  # warm-up
    t0 = time.perf_counter()
    run_inspection(model, batches, mode, device="cpu")
    first = time.perf_counter() - t0
    steps, inspections, ratios = [], [], []
    for _ in range(repeats):
        step = plain_step(model, batches(0), plan, opt)
        t0 = time.perf_counter()
        run_inspection(model, batches, mode, device="cpu")
        seconds = time.perf_counter() - t0
        steps.append(step)
        inspections.append(seconds)
        ratios.append(seconds / step)
    return {"first": first, "step": steps, "inspection": inspections, "ratio": ratios}


def _iqr(values: list[float]) -> float:
    if len(values) < 4:
        return max(values) - min(values)
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=DEFAULT_WORKLOAD)
    parser.add_argument("--preset", default=DEFAULT_PRESET)
    parser.add_argument("--modes", default="fp32,bf16")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    print(
        f"{args.workload}/{args.preset} on CPU ({torch.get_num_threads()} threads), "
        f"{repeats} paired repeats; median (IQR)"
    )
    print(f"{'plan':6} {'plain step s':>16} {'inspection s':>16} {'ratio':>14} {'first s':>8}")
    worst = 0.0
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        r = measure(args.workload, args.preset, mode, repeats)
        med = {k: statistics.median(r[k]) for k in ("step", "inspection", "ratio")}
        worst = max(worst, med["inspection"])
        print(
            f"{mode:6} {med['step']:9.4f} ({_iqr(r['step']):.4f}) "
            f"{med['inspection']:9.4f} ({_iqr(r['inspection']):.4f}) "
            f"{med['ratio']:7.1f}x ({_iqr(r['ratio']):.1f}) {r['first']:8.3f}"
        )
    ok = worst < TARGET_S
    print(f"target: inspection < {TARGET_S:.0f} s -> {'met' if ok else 'MISSED'} ({worst:.3f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
