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
3. **Coverage of every measuring surface**, each run K times in its own process against an
   independent hand-written interleaved loop (``bench_profile.hand_loop``) run in H fresh
   processes (under the allocator settings the surfaces settle by default, :data:`HAND_ENV`)
   and pooled as the geometric mean of their speedups (the quantity an interval over
   processes estimates: the product's t interval is over the processes' log speedups; H = 20 by
   default, as one process's speedup can differ from the next by a third on a CPU). The runs go
   round-robin over the surfaces and the hand processes are spread between them, so the
   reference and the surfaces are measured over the same minutes:
   ``profile`` (``precision-nb profile``, all defaults), the panel's Compare
   (``Panel(workload="mlp", preset="small", steps=48).compare()`` with its default budget) and a
   notebook-defined model (a subclass of the default workload's MLP defined in ``__main__``,
   measured by ``pnb.profile(model, batches)`` with its defaults). How many intervals hold the
   pooled value (target: at least 4 of 5 per surface), over how many processes, what stopped
   each, its wall time (target: under 60 s) and the machine's load.

    python benchmarks/bench_calibration.py                    # everything (minutes)
    python benchmarks/bench_calibration.py --profiles 0       # parts 1 and 2 only
    python benchmarks/bench_calibration.py --surfaces panel,notebook --profiles 5
    python benchmarks/bench_calibration.py --trials 500 --sleep-repeats 20 --profiles 2 --hand 3
    python benchmarks/bench_calibration.py --quick            # a smoke run of every part

A shared machine moves parts 2 and 3: read them with the load they print.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from precision_nb.engine import load as machine_load
from precision_nb.engine import stats, verdicts
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
        kinds.append(verdicts.verdict("B", m.speedup("B", "A"), baseline="A").kind)
    return {k: kinds.count(k) / repeats for k in ("faster", "slower", "unresolved", "too_few")}


# ----------------------------------------------------------------------------- 3. coverage


#: How each surface is measured in its own process: Python that prints the bf16 row as JSON.
#: ``{quick}`` shrinks the run (a smoke run: tiny preset, few steps, a short budget).
SURFACES: dict[str, str] = {
    "panel": """
import json, time
from precision_nb.views.panel import Panel
t = time.perf_counter()
quick = {quick}
panel = Panel(workload="mlp", preset="tiny" if quick else "small", steps=8 if quick else 48,
              compare_plans=("fp32", "bf16"), **(dict(budget=5) if quick else {{}}))
out = panel.compare(block=True)
panel.close()
""",
    "notebook": """
import json, time
import precision_nb as pnb
from precision_nb.engine.workloads import MLP, get_workload

class NotebookMLP(MLP):  # defined in __main__, as in a notebook cell
    pass

t = time.perf_counter()
quick = {quick}
workload = get_workload("mlp", "tiny" if quick else "small")
reference = workload.make_model()
linears = [m for m in reference.net if hasattr(m, "in_features")]
model = NotebookMLP(linears[0].in_features, linears[0].out_features, len(linears) - 1,
                    linears[-1].out_features)
model.load_state_dict(reference.state_dict())  # the default workload's weights, to the bit
source = workload.make_batches("cpu")

def batches(index):  # a notebook's function: it travels by value, with its closure
    return source(index)

result = pnb.profile(model, batches, compare=("fp32", "bf16"), progress=False, inspect=False,
                     numerics=False, **(dict(steps=8, budget_s=5) if quick else {{}}))
out = result.comparison
""",
}
#: Appended to every surface: the bf16 outcome as one JSON line.
REPORT = """
o = out.outcomes["bf16"]
s = o.speedup
print(json.dumps({"estimate": s.estimate, "low": s.low, "high": s.high,
                  "processes": s.processes or 1, "stopped_by": s.stopped_by,
                  "seconds": time.perf_counter() - t}))
"""


def surface_run(surface: str, out: Path, quick: bool = False) -> dict[str, Any]:
    """One measurement by ``surface`` ("profile", "panel", "notebook") in its own process: its
    bf16 estimate and interval, processes, what stopped it, wall time and the machine's load."""
    start = machine_load.sample()
    t0 = time.perf_counter()
    if surface == "profile":
        command = [sys.executable, "-m", "precision_nb.cli", "profile", "--no-progress"]
        if quick:
            command += ["--preset", "tiny", "--steps", "8", "--budget", "5"]
        done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True)
    else:
        code = SURFACES[surface].format(quick=quick) + REPORT
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    load = machine_load.Load(start, machine_load.sample())
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:], "seconds": seconds}
    if surface == "profile":
        with (out / "summary.csv").open(newline="") as handle:
            row = {r["run"]: r for r in csv.DictReader(handle)}["bf16"]
        got = {
            "estimate": float(row["speedup_vs_fp32"]),
            "low": float(row["speedup_ci_low"] or "nan"),
            "high": float(row["speedup_ci_high"] or "nan"),
            "processes": int(row["processes"]),
            "stopped_by": row["stopped_by"],
        }
    else:
        got = json.loads(done.stdout.strip().splitlines()[-1])
        got = {k: math.nan if v is None else v for k, v in got.items()}
    return {**got, "seconds": seconds, "load": load}


#: The host allocator the surfaces measure under by default (``allocator="settled"``), written
#: out here rather than read from the product: glibc malloc's mmap threshold at its 64-bit
#: ceiling (32 MiB) and the trim threshold at twice it, set for a process from its start.
HAND_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "67108864"}


def hand_process(rounds: int, block: int) -> float:
    """bench_profile's hand-written interleaved loop (bf16 over fp32) in a fresh process, under
    the allocator settings the surfaces measure under (:data:`HAND_ENV`)."""
    code = (
        "from bench_profile import hand_loop;"
        f"print(hand_loop(('fp32', 'bf16'), {rounds}, {block})['bf16'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, check=True,
        env={**os.environ, **HAND_ENV},
    )  # fmt: skip
    return float(done.stdout.strip().splitlines()[-1])


def _spread(count: int, gaps: int) -> list[int]:
    """``count`` items spread as evenly as possible over ``gaps`` gaps (the first ones first)."""
    return [count // gaps + (g < count % gaps) for g in range(gaps)]


def coverage(
    profiles: int, hands: int, surfaces: Sequence[str] = ("profile", "panel", "notebook")
) -> list[str]:
    """Each surface's ``profiles`` runs against the pooled hand loop. The runs go round-robin over
    the surfaces, and the ``hands`` hand-loop processes are spread between them, so the reference
    is measured over the same stretch of time as the surfaces: a machine whose speed drifts over
    the minutes this takes moves both alike."""
    from precision_nb.core.defaults import DEFAULT_ROUNDS, DEFAULT_STEPS

    block = max(1, DEFAULT_STEPS // DEFAULT_ROUNDS)
    runs = [(surface, k) for k in range(profiles) for surface in surfaces]
    before = _spread(hands, len(runs) + 1)
    hand: list[float] = []
    got: dict[tuple[str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run, count in zip([*runs, None], before, strict=True):
            hand += [hand_process(DEFAULT_ROUNDS, block) for _ in range(count)]
            if run is None:
                break
            surface, k = run
            got[surface, k] = surface_run(surface, Path(tmp) / f"{surface}{k}")
            done = got[surface, k]
            said = (
                f"failed: {done['error']}"
                if "error" in done
                else f"bf16 {done['estimate']:.2f}x [{done['low']:.2f}-{done['high']:.2f}]"
            )
            print(
                f"  ({len(got)}/{len(runs)} runs, {len(hand)} hand processes so far) {surface} "
                f"{k + 1}: {said}",
                flush=True,
            )
    m = np.log(hand)
    pooled = float(np.exp(m.mean()))
    _, low, high = stats.process_interval(m) if hands > 1 else (0, math.nan, math.nan)
    half = len(hand) // 2
    lines = [
        f"hand loop, {hands} fresh processes between the runs, in order: "
        f"{', '.join(f'{h:.2f}' for h in hand)}; pooled (geometric mean) {pooled:.2f}x (median "
        f"{statistics.median(hand):.2f}x; first half {np.exp(m[:half].mean()):.2f}x, second half "
        f"{np.exp(m[half:].mean()):.2f}x), its own t interval over processes "
        f"{math.exp(low):.2f}-{math.exp(high):.2f} (the reference's own uncertainty: an interval "
        "that misses the pooled value by less may still hold the truth)"
    ]
    for surface in surfaces:
        held = 0
        for k in range(profiles):
            done = got[surface, k]
            if "error" in done:
                lines.append(
                    f"{surface} {k + 1}: failed after {done['seconds']:.0f} s: {done['error']}"
                )
                continue
            lo, hi = done["low"], done["high"]
            holds = lo <= pooled <= hi
            held += holds
            lines.append(
                f"{surface} {k + 1}: bf16 {done['estimate']:.2f}x [{lo:.2f}-{hi:.2f}] "
                f"{'holds' if holds else 'MISSES'} the pooled hand value; over "
                f"{done['processes']} processes, stopped by {done['stopped_by']}; "
                f"{done['seconds']:.0f} s (target < 60 s); {done['load'].describe()}"
            )
        lines.append(
            f"coverage, {surface}: {held} of {profiles} intervals hold the pooled value "
            "(target: at least 4 of 5)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=2000, help="simulated comparisons per cell")
    parser.add_argument("--sleep-repeats", type=int, default=100, help="sleep-model comparisons")
    parser.add_argument("--profiles", type=int, default=5, help="default profiles (0: skip)")
    parser.add_argument("--hand", type=int, default=20, help="hand-loop processes")
    parser.add_argument(
        "--surfaces", default="profile,panel,notebook", help="comma-separated surfaces to cover"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: few trials, one tiny run per surface"
    )
    args = parser.parse_args(argv)
    surfaces = [x.strip() for x in args.surfaces.split(",") if x.strip()]
    unknown = sorted(set(surfaces) - {"profile", *SURFACES})
    if unknown:
        parser.error(f"--surfaces: unknown {unknown}; allowed: profile, {', '.join(SURFACES)}")
    if args.quick:
        args.trials, args.sleep_repeats, args.profiles = 40, 0, 0
        for surface in surfaces:
            with tempfile.TemporaryDirectory() as tmp:
                got = surface_run(surface, Path(tmp) / "out", quick=True)
            print(f"quick {surface}: {got}", flush=True)
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
        for line in coverage(args.profiles, args.hand, surfaces):
            print(line, flush=True)
    whole = machine_load.Load(start, machine_load.sample())
    print(f"machine load over the whole benchmark: {whole.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
