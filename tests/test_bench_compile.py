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


def test_the_load_line_names_the_load_and_the_cpus():
    line = _load().load_line()
    assert line.startswith("load average ") and " CPUs" in line


def test_the_profile_targets_are_the_documented_budgets():
    bench = _load()
    assert (bench.PROFILE_BUDGET_S, bench.EAGER_BUDGET_S) == (180.0, 60.0)
