"""torch.compile against eager, per precision: compile time, pay-back and compiled/eager speedups.

Part 1 (in this process): ``compare(("fp32", "bf16"), "mlp", "small", compile=("off",
"default"))`` measures every precision eager and compiled in the same rounds, then prints per
compiled plan: the compile step (seconds, torch's own accounting, cache hit or miss), the
compiled/eager speedup with its interval (the paired method of every speedup), the pay-back steps
with their range, and whether it trains what eager trains. With ``--cold`` the inductor cache is a
fresh folder, so the compile is cold (the first compile a user without a cache pays); otherwise
the cache of this machine answers where it can, and the cache column says so.

Part 2 (fresh processes, timed from outside): the wall time of ``precision-nb profile --compile
default --compare fp32,bf16`` on mlp/small (target: under 3 minutes on a 2-core CPU) and of the
default eager profile (target: under 60 s), each into a temporary folder.

    python benchmarks/bench_compile.py              # both parts
    python benchmarks/bench_compile.py --cold       # part 1 with an empty inductor cache
    python benchmarks/bench_compile.py --part 1     # only the in-process comparison

The machine's load while the benchmark ran is printed last (the share of CPU time other processes
used, this benchmark's own children excluded): timings taken while other work runs are not the
machine's; take them again on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from precision_nb.engine import load as machine_load

PROFILE_BUDGET_S = 180.0
EAGER_BUDGET_S = 60.0


def load_line(start: machine_load.LoadSample) -> str:
    """The load since ``start``: other processes' share of the CPU time (not this benchmark's)."""
    load = machine_load.Load(start, machine_load.sample())
    busy = " (busy: the timings measure contention too)" if load.busy else ""
    return f"machine load: {load.describe()}{busy}"


def in_process(rounds: int, steps: int, preset: str) -> list[str]:
    """Part 1: one comparison, eager and compiled, and the lines per compiled plan."""
    import precision_nb as pnb
    from precision_nb.engine.measure import MeasureConfig

    start = time.perf_counter()
    comparison = pnb.compare(
        ("fp32", "bf16"), "mlp", preset, device="cpu", compile=("off", "default"), steps=steps,
        progress=False, measure=MeasureConfig(rounds=rounds),
    )  # fmt: skip
    seconds = time.perf_counter() - start
    lines = [f"compare(fp32, bf16 x off, default) on mlp/{preset}: {seconds:.1f} s wall"]
    for label, report in comparison.compiled.items():
        r, s, pb = report.record, report.speedup, report.pay_back
        ci = f" (95 % CI {s.low:.2f}-{s.high:.2f})" if s is not None and s.has_interval else ""
        speed = f"{s.estimate:.2f}x{ci}" if s is not None else "not measured"
        if pb is None or pb.steps is None:
            steps_text = "never pays back at this step time"
        else:
            steps_text = f"pays back after {pb.steps} steps"
            if pb.steps_high is None:
                steps_text += " (the interval includes never)"
            elif pb.steps_low is not None:
                steps_text += f" (range {pb.steps_low}-{pb.steps_high})"
        agrees = report.agreement.agrees if report.agreement is not None else None
        lines.append(
            f"  {label}: compile step {r.compile_s:.2f} s (torch: {r.torch_compile_s:.2f} s, cache "
            f"{r.cache}), compiled/eager {speed}, {steps_text}, trains what "
            f"eager trains: {agrees}, recompilations: {len(r.recompiles)}"
        )
    return lines


def cli_seconds(args: list[str]) -> tuple[float, int]:
    """Wall seconds and exit code of ``precision-nb profile ARGS`` in a fresh process."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "precision_nb.cli", "profile", *args, "--out",
                   str(Path(folder) / "out")]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
    return seconds, done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", type=int, choices=(1, 2), default=None)
    parser.add_argument("--cold", action="store_true", help="part 1 with an empty inductor cache")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--preset", default="small")
    args = parser.parse_args(argv)
    start = machine_load.sample()
    if args.part in (None, 1):
        if args.cold:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="pnb-inductor-")
        print("\n".join(in_process(args.rounds, args.steps, args.preset)))
    if args.part in (None, 2):
        for name, flags, budget in (
            ("profile --compile default --compare fp32,bf16", ["--compile", "default",
             "--compare", "fp32,bf16"], PROFILE_BUDGET_S),
            ("profile (default, eager)", [], EAGER_BUDGET_S),
        ):  # fmt: skip
            seconds, code = cli_seconds(flags)
            verdict = "within" if seconds <= budget else "OVER"
            print(
                f"{name}: {seconds:.1f} s wall, exit {code} ({verdict} the {budget:.0f} s "
                "target; one run, not an interval)"
            )
    print(load_line(start))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
