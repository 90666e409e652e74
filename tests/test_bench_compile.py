"""benchmarks/bench_compile.py keeps working: its load line and its flags (the comparison it
runs compiles, so it is run by hand, not here; docs/profiling.md names the command)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_compile.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_compile", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_load_line_counts_other_processes_not_its_own_children():
    import subprocess
    import sys

    bench = _load()
    start = bench.machine_load.sample()
    # the benchmark's own work: a child busy for 1 s of CPU, waited for
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    load = bench.machine_load.Load(start, bench.machine_load.sample())
    child_share = 1.0 / load.capacity_s  # what the child alone would add if it were "others"
    assert load.others_share < child_share * 0.8
    line = bench.load_line(start)
    assert line.startswith("machine load: other processes used ") and " CPUs" in line


def test_the_profile_targets_are_the_documented_budgets():
    bench = _load()
    assert (bench.PROFILE_BUDGET_S, bench.EAGER_BUDGET_S) == (180.0, 60.0)
