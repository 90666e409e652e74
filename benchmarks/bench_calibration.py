"""Do the speed intervals mean what they say? False verdicts, power and coverage, measured.

Three parts, each printed as rates and ratios (nothing here is a timed assertion):

1. **Simulation** (:mod:`precision_nb.engine.calibration`, the product's own statistics): the
   false "faster"/"slower" rate with identical plans, per round count in one process, per number
   of processes, and for the target-driven procedure, for each step-time shape; the power at a
   true 1.3x; beside them the previous method (percentile bootstrap of the median over rounds).
2. **A real model whose two plans cost the same by construction**: a module whose forward
   sleeps, trained by the engine's Trainer under two labels of the same fp32 plan, measured by
   :func:`~precision_nb.engine.measure.measure_plans`; every verdict other than "unresolved" is
   false. The machine's scheduler supplies the noise.
3. **Coverage of the default profile**: ``precision-nb profile`` (all defaults) run K times, each
   in its own process, against an independent hand-written interleaved loop
   (``bench_profile.hand_loop``) run in H fresh processes and pooled (their median): how many
   profile intervals hold the pooled value, what stopped each profile, its wall time (target:
   under 60 s) and the machine's load while it ran.

    python benchmarks/bench_calibration.py                    # everything (minutes)
    python benchmarks/bench_calibration.py --profiles 0       # parts 1 and 2 only
    python benchmarks/bench_calibration.py --trials 500 --sleep-repeats 20 --profiles 2 --hand 3

A shared machine moves parts 2 and 3: read them with the load they print.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from precision_nb.engine import load as machine_load
from precision_nb.engine import stats
from precision_nb.engine.calibration import SCENARIOS, simulate, verdict_rates

ROUNDS = (4, 5, 6, 8, 12, 16)
FIXED = ((2, 8), (3, 8), (5, 8), (8, 8))
HERE = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- 1. simulation


def bootstrap_rates(base: np.ndarray, plan: np.ndarray, resamples: int = 1000) -> float:
    """False-verdict rate of the previous method: median of per-round ratios, 95 % percentile
    bootstrap over rounds (one process), vectorised over the trials."""
    d = np.log(np.median(base[:, 0], axis=-1) / np.median(plan[:, 0], axis=-1))  # [trials, R]
    rng = np.random.default_rng(0)
    false = 0
    for chunk in np.array_split(d, max(1, len(d) // 250)):
        idx = rng.integers(0, d.shape[1], size=(resamples, d.shape[1]))
        medians = np.median(chunk[:, idx], axis=-1)  # [trials, resamples]
        low, high = np.quantile(medians, [0.025, 0.975], axis=-1)
        false += int(((low > 0) | (high < 0)).sum())
    return false / len(d)


def simulated_rates(trials: int = 2000, steps: int = 3) -> list[str]:
    """Lines of the simulation table: false rates (identical plans) and power (1.3x)."""
    lines = [
        f"simulation, {trials} comparisons per cell ({steps} steps per block); Monte-Carlo "
        f"error of a 5 % rate: ±{100 * math.sqrt(0.05 * 0.95 / trials):.1f} points"
    ]
    for scenario in SCENARIOS:
        lines.append(f"  {scenario}: {SCENARIOS[scenario]}")
        cells = []
        for rounds in ROUNDS:
            base, plan = simulate(scenario, trials, 1, rounds, steps, seed=rounds)
            false = verdict_rates(base, plan, "rounds").resolved
            old = bootstrap_rates(base, plan) if rounds >= stats.MIN_ROUNDS - 2 else math.nan
            fast, slow = simulate(scenario, trials, 1, rounds, steps, effect=1.3, seed=rounds + 1)
            power = verdict_rates(fast, slow, "rounds").faster
            cells.append(f"{rounds}r {false:.1%} (bootstrap {old:.1%}) power {power:.0%}")
        lines.append(
            "    one process, false (previous method) / power at 1.3x: " + "; ".join(cells)
        )
        for sd in (0.0, 0.15):
            cells = []
            for processes, rounds in FIXED:
                base, plan = simulate(scenario, trials, processes, rounds, steps, 1.0, sd, seed=9)
                fast, slow = simulate(scenario, trials, processes, rounds, steps, 1.3, sd, seed=10)
                false = verdict_rates(base, plan, "fixed").resolved
                power = verdict_rates(fast, slow, "fixed").faster
                cells.append(f"{processes}x{rounds} {false:.1%} power {power:.0%}")
            lines.append(f"    fixed processes, process sd {sd:.2f}: " + "; ".join(cells))
            cells = []
            for most in (6, 10):
                base, plan = simulate(scenario, trials, most, 8, steps, 1.0, sd, seed=most)
                fast, slow = simulate(scenario, trials, most, 8, steps, 1.3, sd, seed=most + 1)
                null, alt = verdict_rates(base, plan, "target"), verdict_rates(fast, slow, "target")
                cells.append(
                    f"at most {most}: false {null.resolved:.1%} ({null.processes:.1f} processes), "
                    f"power {alt.faster:.0%} ({alt.processes:.1f} processes)"
                )
            lines.append(f"    target ±5 %, process sd {sd:.2f}: " + "; ".join(cells))
    return lines


# ----------------------------------------------------------------------------- 2. sleep model


def sleep_null(rounds: int, repeats: int, seconds: float = 0.002, block: int = 2) -> dict:
    """Verdicts of ``repeats`` comparisons of two labels of one fp32 plan on a sleeping model."""
    import torch
    from torch import nn

    from precision_nb.core.plan import PrecisionConfig
    from precision_nb.engine.measure import MeasureConfig, PlanSpec, measure_plans
    from precision_nb.engine.measure_processes import trainer_sessions
    from precision_nb.engine.train_config import TrainConfig

    class Sleeper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(seconds)
            return x * self.w

    steps = rounds * block
    train = TrainConfig(steps=steps, log_every=steps, progress=False, measure_peak=False)
    same = PrecisionConfig("fp32")
    kinds: list[str] = []
    for _ in range(repeats):
        make = trainer_sessions(
            Sleeper(),
            [(torch.ones(1, 1), torch.zeros(1, 1))],
            device="cpu",
            plans={"A": same, "B": same},
            optimizer=None,
            train=train,
            loss_fn=lambda out, y: (out - y).pow(2).mean(),
        )
        cfg = MeasureConfig(rounds=rounds, warmup_min=2, warmup_max=4)
        m, _, _ = measure_plans([PlanSpec("A", same), PlanSpec("B", same)], make, steps, cfg)
        kinds.append(stats.verdict("B", m.speedup("B", "A"), baseline="A").kind)
    return {k: kinds.count(k) / repeats for k in ("faster", "slower", "unresolved", "too_few")}


# ----------------------------------------------------------------------------- 3. coverage


def default_profile(out: Path) -> dict[str, Any]:
    """One default ``precision-nb profile`` in its own process: its bf16 row and wall time."""
    start = machine_load.sample()
    t0 = time.perf_counter()
    command = [sys.executable, "-m", "precision_nb.cli", "profile", "--no-progress", "--out"]
    done = subprocess.run([*command, str(out)], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    load = machine_load.Load(start, machine_load.sample())
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:], "seconds": seconds}
    with (out / "summary.csv").open(newline="") as handle:
        row = {r["run"]: r for r in csv.DictReader(handle)}["bf16"]
    return {"row": row, "seconds": seconds, "load": load}


def hand_process(rounds: int, block: int) -> float:
    """bench_profile's hand-written interleaved loop (bf16 over fp32) in a fresh process."""
    code = (
        "from bench_profile import hand_loop;"
        f"print(hand_loop(('fp32', 'bf16'), {rounds}, {block})['bf16'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def coverage(profiles: int, hands: int) -> list[str]:
    from precision_nb.core.defaults import DEFAULT_ROUNDS, DEFAULT_STEPS

    block = max(1, DEFAULT_STEPS // DEFAULT_ROUNDS)
    hand = [hand_process(DEFAULT_ROUNDS, block) for _ in range(hands)]
    pooled = statistics.median(hand)
    m = np.log(hand)
    _, low, high = stats.process_interval(m) if hands > 1 else (0, math.nan, math.nan)
    lines = [
        f"hand loop, {hands} fresh processes: {', '.join(f'{h:.2f}' for h in hand)}; pooled "
        f"(median) {pooled:.2f}x, its own t interval over processes "
        f"{math.exp(low):.2f}-{math.exp(high):.2f}"
    ]
    held = 0
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(profiles):
            got = default_profile(Path(tmp) / f"p{k}")
            if "error" in got:
                lines.append(
                    f"profile {k + 1}: failed after {got['seconds']:.0f} s: {got['error']}"
                )
                continue
            row = got["row"]
            lo, hi = float(row["speedup_ci_low"] or "nan"), float(row["speedup_ci_high"] or "nan")
            holds = lo <= pooled <= hi
            held += holds
            lines.append(
                f"profile {k + 1}: bf16 {float(row['speedup_vs_fp32']):.2f}x [{lo:.2f}-{hi:.2f}] "
                f"{'holds' if holds else 'MISSES'} the pooled hand value; {row['processes']} "
                f"processes, stopped by {row['stopped_by']}; {got['seconds']:.0f} s "
                f"(target < 60 s); {got['load'].describe()}"
            )
    lines.append(f"coverage: {held} of {profiles} default-profile intervals hold the pooled value")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=2000, help="simulated comparisons per cell")
    parser.add_argument("--sleep-repeats", type=int, default=100, help="sleep-model comparisons")
    parser.add_argument("--profiles", type=int, default=5, help="default profiles (0: skip)")
    parser.add_argument("--hand", type=int, default=5, help="hand-loop processes")
    args = parser.parse_args(argv)
    start = machine_load.sample()
    for line in simulated_rates(args.trials):
        print(line, flush=True)
    if args.sleep_repeats:
        print(f"sleep model (two labels of one plan), {args.sleep_repeats} comparisons each:")
        for rounds in (4, 6, 8, 12):
            t0 = time.perf_counter()
            rates = sleep_null(rounds, args.sleep_repeats)
            false = rates["faster"] + rates["slower"]
            print(
                f"  {rounds} rounds: false verdicts {false:.1%} (faster {rates['faster']:.1%}, "
                f"slower {rates['slower']:.1%}), no interval {rates['too_few']:.0%}; "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    if args.profiles:
        for line in coverage(args.profiles, args.hand):
            print(line, flush=True)
    whole = machine_load.Load(start, machine_load.sample())
    print(f"machine load over the whole benchmark: {whole.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
