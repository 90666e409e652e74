"""What sets the width of the interval over fresh processes: each process's own speedup, or how
precisely its rounds measure it?

One comparison of the default workload (bf16 against fp32) measures in ``--processes`` processes
(this one and fresh ones, no target, no budget) with ``--steps`` measured steps per plan in each.
Per process: its estimate (the Hodges-Lehmann estimate of its rounds' paired log ratios, the
value the interval over processes is built from) and its rounds' standard error (their standard
deviation over the square root of their number). Printed: the estimates, their standard
deviation, the rounds' root-mean-square standard error, what is left for the processes' own
values (the square root of the difference of the squares), the processes a ±``--target``
interval at 95 % would need at that spread, and the seconds one fresh process cost here (the
measurement's own event). Run it twice with different ``--steps``: if the spread does not fall
with more steps per process, only more processes narrow the interval.

    python benchmarks/bench_process_spread.py                   # 12 processes, 48 steps each
    python benchmarks/bench_process_spread.py --steps 144       # three times the steps
    python benchmarks/bench_process_spread.py --processes 3 --steps 8 --preset tiny  # smoke run
    python benchmarks/bench_process_spread.py --allocator both --repeats 2   # settled vs as-is

``--allocator`` is the measurement's (``settled``, the default, or ``as-is``); ``both`` runs the
two alternately, each run in its own process (settling is for the life of a process), and prints
each one's spread, speedups and fresh processes per second, then the ratio of the rates.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

from precision_nb.core.defaults import DEFAULT_PRESET, DEFAULT_STEPS, DEFAULT_WORKLOAD


def decompose(estimates: Sequence[float], errors: Sequence[float]) -> dict[str, float]:
    """The spread of the process estimates, the rounds' root-mean-square error, and the spread
    left for the processes' own values (0 when the rounds' error explains all of it)."""
    values, err = np.asarray(estimates, float), np.asarray(errors, float)
    spread = float(values.std(ddof=1))
    within = float(np.sqrt(np.mean(err**2)))
    return {"spread": spread, "within": within, "between": math.sqrt(max(spread**2 - within**2, 0))}


def processes_needed(spread: float, target: float, confidence: float = 0.95) -> int:
    """The fewest processes whose t interval's relative half-width (log scale) is within
    ``target`` when the estimates spread by ``spread``."""
    for n in range(2, 10_000):
        half = sps.t.ppf(0.5 + confidence / 2, n - 1) * spread / math.sqrt(n)
        if math.expm1(half) <= target:
            return n
    return 10_000


def measure(
    processes: int, steps: int, preset: str, allocator: str = "settled"
) -> tuple[list[float], list[float], str]:
    """Each process's estimate and its rounds' standard error, and the fresh processes' event."""
    import precision_nb as pnb
    from precision_nb.engine import stats
    from precision_nb.engine.measure_config import MeasureConfig

    cfg = MeasureConfig(processes=processes, target=None, budget_s=None, allocator=allocator)
    c = pnb.compare(("fp32", "bf16"), DEFAULT_WORKLOAD, preset, steps=steps, progress=False,
                    measure=cfg)  # fmt: skip
    m = c.measurement
    pairs = list(zip(m.blocks_by_process("fp32"), m.blocks_by_process("bf16"), strict=True))
    estimates = stats.process_estimates(pairs).tolist()  # the values the interval is built from
    rounds = [np.array(d) for d in (stats.log_ratios(b, p) for b, p in pairs) if d]  # same order
    errors = [float(d.std(ddof=1) / math.sqrt(d.size)) for d in rounds]
    rate = next((e.message for e in m.events if "fresh process(es) in" in e.message), "")
    return estimates, errors, rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=12)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="per plan and process")
    parser.add_argument("--preset", default=DEFAULT_PRESET)
    parser.add_argument("--target", type=float, default=0.05)
    parser.add_argument("--allocator", choices=("settled", "as-is", "both"), default="settled")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each with --allocator both")
    args = parser.parse_args(argv)
    if args.processes < 3:
        parser.error("--processes: at least 3 (a spread needs two fresh processes and this one)")
    if args.allocator == "both":
        return both(args)
    estimates, errors, rate = measure(args.processes, args.steps, args.preset, args.allocator)
    parts = decompose(estimates, errors)
    print(f"{DEFAULT_WORKLOAD}/{args.preset}, {args.steps} steps per plan in each process")
    print("speedups per process: " + ", ".join(f"{math.exp(v):.3f}" for v in estimates))
    print(
        f"spread of the process estimates (sd, log) {parts['spread']:.3f}; the rounds' own "
        f"standard error (rms) {parts['within']:.3f}; left for the processes' own values "
        f"{parts['between']:.3f}"
    )
    need = processes_needed(parts["spread"], args.target)
    print(f"processes for ±{args.target * 100:g} % at 95 % at this spread: {need}")
    print(rate)
    return 0


#: The rate in the measurement's event: "11 fresh process(es) in 28.0 s (0.39 per second; ...".
RATE = re.compile(r"\(([0-9.]+) per second")


def both(args: argparse.Namespace) -> int:
    """``--allocator settled`` and ``as-is`` alternately, each run in a process of its own."""
    rates: dict[str, list[float]] = {"settled": [], "as-is": []}
    for repeat in range(args.repeats):
        for allocator in rates:
            command = [
                sys.executable, __file__, "--allocator", allocator, "--processes",
                str(args.processes), "--steps", str(args.steps), "--preset", args.preset,
                "--target", str(args.target),
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            print(f"== {allocator}, run {repeat + 1}\n{done.stdout.strip()}", flush=True)
            rates[allocator] += [float(m) for m in RATE.findall(done.stdout)]
    mid = {k: float(np.median(v)) for k, v in rates.items()}
    print(
        f"fresh processes per second (median): settled {mid['settled']:.2f}, as-is "
        f"{mid['as-is']:.2f}; settled / as-is {mid['settled'] / mid['as-is']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
