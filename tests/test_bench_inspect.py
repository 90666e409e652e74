"""benchmarks/bench_inspect.py keeps working (its timings are read, not asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_inspect.py"


def test_bench_inspect_measures_paired_ratios() -> None:
    spec = importlib.util.spec_from_file_location("bench_inspect", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.measure("mlp", "tiny", "bf16", repeats=1)
    assert set(result) == {"first", "step", "inspection", "ratio"}
    assert len(result["ratio"]) == 1 and result["ratio"][0] > 0
    assert result["ratio"][0] == result["inspection"][0] / result["step"][0]
