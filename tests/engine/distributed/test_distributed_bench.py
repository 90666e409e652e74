"""benchmarks/bench_distributed.py keeps working (timings are read, not asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch.distributed as dist

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_distributed.py"


def test_paired_rounds_time_both_groups_and_count_the_all_reduce(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("bench_distributed", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ratios, per_step = bench.paired_rounds("tiny", rounds=2, block=2, rank=0, world=1)
        counted_s, plain_s = bench.per_call_overhead(calls=20, block=5)
        flight = bench.in_flight_check(calls=3, numel=1000)
    finally:
        dist.destroy_process_group()
    assert len(ratios) == 2 and all(r > 0 for r in ratios)
    assert counted_s > 0 and plain_s > 0
    assert len(flight) == 3 and all(r > 0 for r in flight)  # every call timed, read back
    params = (64 * 128 + 128) + (128 * 128 + 128) + (128 * 10 + 10)
    assert per_step == 4 * params  # one fp32 all-reduce of every gradient per step
    assert bench.paired_rounds.calls_per_step >= 1  # DDP issues at least one call per step
