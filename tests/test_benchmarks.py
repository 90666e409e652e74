"""The benchmarks keep working (their timings are not asserted: they are read, not tested)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_fit_measures_both_loops_machinery() -> None:
    bench = _load("bench_fit")
    fit_s, hand_s = bench.machinery(steps=20, repeats=1)
    assert 0 < fit_s < 1 and 0 < hand_s < 1


def test_bench_fit_hand_loop_trains_the_same_workload() -> None:
    bench = _load("bench_fit")
    from precision_nb.engine.workloads import get_workload

    wl = get_workload("mlp", "tiny")
    model = wl.make_model()
    before = [p.detach().clone() for p in model.parameters()]
    seconds = bench.torch_loop(model, wl.make_batches("cpu"), "bf16", 3, 0)
    assert seconds > 0
    assert any(not p.equal(b) for p, b in zip(model.parameters(), before, strict=True))


def test_bench_fit_pure_bf16_hand_loop_trains_bf16_weights() -> None:
    bench = _load("bench_fit")
    from precision_nb.engine.workloads import get_workload

    wl = get_workload("mlp", "tiny")
    model = wl.make_model()
    before = [p.detach().to(torch.bfloat16) for p in model.parameters()]
    assert bench.torch_loop(model, wl.make_batches("cpu"), "bf16-true", 3, 0) > 0
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert any(not p.equal(b) for p, b in zip(model.parameters(), before, strict=True))
    assert bench.fit_loop(wl.make_model(), wl.make_batches("cpu"), "bf16-true", 2, wl.info) > 0
    case = bench.bench_case("mlp", "tiny", "bf16-true:probe", 2, repeats=1, seconds=0.0)
    assert case["fit/torch"] > 0 and case["repeats"] == 1


def test_bench_panel_latency_cycles_through_the_changes() -> None:
    bench = _load("bench_panel")
    from precision_nb.views.panel import Panel

    panel = Panel(steps=2)
    times = bench.plan_latency(panel, changes=len(bench.CHANGES), cached=False)
    assert len(times) >= len(bench.CHANGES) - 2 and all(t > 0 for t in times)
    assert panel.widgets.loss_scale_lab.value is False  # the cycle ends where it started


def test_bench_profile_hand_loop_gives_a_paired_ratio() -> None:
    bench = _load("bench_profile")
    ratios = bench.hand_loop(("fp32", "bf16"), rounds=2, block=1, warmup=1)
    assert set(ratios) == {"bf16"} and ratios["bf16"] > 0


def test_bench_profile_counts_fresh_processes_per_second() -> None:
    from precision_nb.engine.process_start import HOW

    rate = _load("bench_profile").process_rate(processes=2, preset="tiny", steps=2)
    assert rate["fresh_processes"] == 1 and rate["per_second"] > 0 and rate["start"] == HOW


def test_bench_process_start_needs_two_of_each_to_compare_spreads(capsys) -> None:
    bench = _load("bench_process_start")
    with pytest.raises(SystemExit):
        bench.main(["--children", "1"])
    assert "--exec, --parents and --children: each at least 2" in capsys.readouterr().err


def test_bench_calibration_measures_the_panel_and_a_notebook_model_in_their_own_processes(
    tmp_path,
) -> None:
    bench = _load("bench_calibration")
    for surface in ("panel", "notebook"):
        got = bench.surface_run(surface, tmp_path / surface, quick=True)
        assert "error" not in got, got
        assert got["estimate"] > 0 and got["processes"] >= 1 and got["stopped_by"]
        assert got["seconds"] > 0 and got["load"] is not None


def test_bench_calibration_spreads_the_hand_loop_between_round_robin_runs(monkeypatch) -> None:
    bench = _load("bench_calibration")
    assert bench._spread(20, 16) == [2, 2, 2, 2] + [1] * 12 and sum(bench._spread(7, 3)) == 7
    order: list[str] = []

    def hand(rounds: int, block: int) -> float:
        order.append("hand")
        return 1.25

    def run(surface: str, out: object, quick: bool = False) -> dict:
        order.append(surface)
        low = 1.3 if surface == "panel" else 1.1  # the panel's intervals all miss 1.25
        load = SimpleNamespace(describe=lambda: "quiet")
        return {"estimate": 1.2, "low": low, "high": 1.4, "processes": 3, "stopped_by": "x",
                "seconds": 1.0, "load": load}  # fmt: skip

    monkeypatch.setattr(bench, "hand_process", hand)
    monkeypatch.setattr(bench, "surface_run", run)
    lines = bench.coverage(2, 5, ("profile", "panel"))
    assert order == ["hand", "profile", "hand", "panel", "hand", "profile", "hand", "panel", "hand"]
    assert "pooled (geometric mean) 1.25x" in lines[0]
    assert "coverage, profile: 2 of 2 intervals hold" in "\n".join(lines)
    assert "coverage, panel: 0 of 2 intervals hold" in "\n".join(lines)


def test_bench_numerics_times_both_variants_and_a_full_call():
    bench = _load("bench_numerics")
    pairs = bench.step_times("mlp", "tiny", steps=2, repeats=2)
    assert len(pairs) == 2 and all(p > 0 and s > 0 and 0 < a < s for p, s, a in pairs)
    assert len(bench.numerics_seconds("mlp", "tiny", calls=1)) == 1
    fits = bench.fit_step_times("mlp", "tiny", steps=2, repeats=2, every=(None, 1))
    assert len(fits) == 2 and all(set(f) == {None, 1} and min(f.values()) > 0 for f in fits)


def test_bench_numerics_times_the_block_formats_beside_todays_calls():
    import pytest

    pytest.importorskip("torchao", reason="the test extra installs torchao (the blocks extra)")
    bench = _load("bench_numerics")
    pairs = bench.block_pairs("mlp", None, "tiny", calls=1)
    assert len(pairs) == 1 and set(pairs[0]) == set(bench.BLOCK_VARIANTS)
    assert min(pairs[0].values()) > 0
    model, batches = bench.gpt2_tiny()  # the test extra installs transformers
    assert len(bench.block_pairs(model, batches, "tiny", calls=1)) == 1


def test_bench_calibration_prints_rates_from_the_product_statistics():
    bench = _load("bench_calibration")
    lines = bench.simulated_rates(trials=40)
    assert lines[0].startswith("simulation, 40 comparisons") and any("power" in x for x in lines)
    rates = bench.sleep_null(rounds=6, repeats=1)
    assert sum(rates.values()) == 1.0


def test_bench_time_split_quick_run_prints_its_table():
    bench = _load("bench_time_split")
    row = bench.run_case("mlp-small", quick=True)
    assert row["split_s"] > 0 and row["wall_s"] > row["split_s"]
    assert row["fp32"]["missing"] is None and row["bf16"]["missing"] is None
    assert row["diff"]["reconstructed"] > 0 and row["diff"]["sentence"].startswith("bf16 ")
    lines = bench.table([row])
    assert lines[0].split()[:2] == ["case", "run"] and lines[1].startswith("mlp-small")
    assert "inside the calibrated interval in" in lines[-1]


def test_bench_true_demo_counts_lost_updates_as_the_run_measures_them() -> None:
    bench = _load("bench_true")
    runs = bench.demo(steps=6)
    assert set(runs) == set(bench.PLANS)
    for r in runs.values():
        assert r["never_moved"] == r["never_moved_by_hand"]
    assert runs["bf16-true"]["never_moved"] > runs["fp32"]["never_moved"]
    memory = bench.memory_check(preset="tiny")
    assert memory["bf16"]["measured"] == 2 * memory["bf16-true"]["measured"]
    assert all(m["measured"] == m["by_hand"] for m in memory.values())


def test_bench_process_spread_separates_the_processes_own_values_from_the_rounds_error() -> None:
    bench = _load("bench_process_spread")
    rng = np.random.default_rng(0)
    own = rng.normal(0.3, 0.10, 4000)  # each process's own log speedup
    errors = np.full(own.size, 0.04)  # its rounds' standard error
    parts = bench.decompose(own + rng.normal(0, 0.04, own.size), errors)
    assert parts["between"] == pytest.approx(0.10, abs=0.005)
    assert parts["spread"] == pytest.approx(math.hypot(0.10, 0.04), abs=0.005)
    assert bench.decompose([0.1, 0.2, 0.3], [1.0, 1.0, 1.0])["between"] == 0.0
    # the t interval's half-width: 19 processes reach ±5 % at a spread of 0.10, 18 do not
    assert bench.processes_needed(0.10, 0.05) == 19
    half = stats.t.ppf(0.975, 18) * 0.10 / math.sqrt(19)
    assert math.expm1(half) <= 0.05 < math.expm1(stats.t.ppf(0.975, 17) * 0.10 / math.sqrt(18))


def test_bench_process_spread_measures_each_process_once(capsys) -> None:
    bench = _load("bench_process_spread")
    estimates, errors, rate = bench.measure(processes=3, steps=8, preset="tiny")
    assert len(estimates) == len(errors) == 3 and all(e > 0 for e in errors)
    assert rate.startswith("2 fresh process(es) in")
    assert bench.RATE.search(rate)  # what --allocator both reads back
    with pytest.raises(SystemExit):
        bench.main(["--processes", "2"])
    assert "--processes: at least 3" in capsys.readouterr().err
