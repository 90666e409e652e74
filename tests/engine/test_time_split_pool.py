"""The time split pooled over the processes that measured: the families' means, the profiler's
cost taken out once against the timed medians, each process's own reconstruction, and a real
comparison whose fresh process profiles its own steps and sends them back."""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest

from precision_nb.engine.measure import MeasureConfig
from precision_nb.engine.measurement import PlanTiming
from precision_nb.engine.time_split import FAMILIES, TimeSplit, difference
from precision_nb.engine.time_split.pool import (
    PROCESS_SPLIT,
    by_process,
    from_processes,
    pooled,
)
from precision_nb.engine.time_split.profiling import CastSummary
from precision_nb.engine.time_split.ranks import to_json


def _split(label: str, steps: int = 6, **ms: float) -> TimeSplit:
    """A traced split (the profiler's cost left in): ``ms``: family -> milliseconds per step;
    events per step: 100 in matmuls, 300 in the optimizer, 50 in casts where there are casts."""
    traced = {f: ms.get(f, 0.0) / 1e3 for f in FAMILIES}
    events = {f: 0.0 for f in FAMILIES} | {"matmul": 100.0, "optimizer": 300.0}
    if ms.get("casts"):
        events["casts"] = 50.0
    return TimeSplit(
        label, traced, sum(traced.values()), traced, sum(traced.values()), timer_s=0.01,
        steps=steps, events=int(sum(events.values())), family_events=events, seconds=0.1,
        casts=CastSummary(count=float(steps)), view="host self time per op (CPU)",
    )  # fmt: skip


HERE = {
    "fp32": (_split("fp32", 12, matmul=5, optimizer=3), 7e-3),
    "bf16": (_split("bf16", 12, matmul=2, casts=1, optimizer=3), 5e-3),
}
FRESH = {
    "fp32": (_split("fp32", matmul=7, optimizer=3), 9e-3),
    "bf16": (_split("bf16", matmul=2, casts=1, optimizer=3.4), 5.4e-3),
}


def test_families_are_the_processes_means_less_the_profilers_cost_taken_once() -> None:
    out = pooled(HERE, [FRESH])
    fp32, bf16 = out["fp32"], out["bf16"]
    # traced means: fp32 6 + 3 = 9 ms against the timed medians' mean 8 ms; bf16 6.2 against
    # 5.2: 2 ms over 800 events outside casts, 2.5 us each, 1 ms per plan by its 400 events
    assert fp32.traced["matmul"] == pytest.approx(6e-3) and fp32.unprofiled_s == pytest.approx(8e-3)
    assert fp32.profiler_s == pytest.approx(1e-3) == pytest.approx(bf16.profiler_s)
    assert fp32.families["matmul"] == pytest.approx(6e-3 - 0.25e-3)
    assert fp32.families["optimizer"] == pytest.approx(3e-3 - 0.75e-3)
    assert bf16.families["casts"] == pytest.approx(1e-3)  # casts' events are not charged
    assert fp32.step_s / bf16.step_s == pytest.approx(8 / 5.2)
    assert (fp32.processes, fp32.steps) == (2, 18)
    # what only this process has (casts' bytes, shapes, ops) and the cost of both processes
    assert fp32.casts == HERE["fp32"][0].casts and fp32.seconds == pytest.approx(0.2)
    assert (
        "pooled over 2 processes" in fp32.notes[-1]
        and "12 here, 6 in each fresh" in (fp32.notes[-1])
    )
    # each process alone: here 1 ms each (7 / 5 = 1.4), the fresh one 1 ms each (9 / 5.4)
    assert by_process(HERE, [FRESH], "fp32")["bf16"] == pytest.approx((1.4, 9 / 5.4))


def test_a_process_that_split_some_plans_only_is_not_pooled_and_the_split_says_so() -> None:
    partial = {"fp32": FRESH["fp32"]}
    out = pooled(HERE, [partial, FRESH, {}])
    assert out["bf16"].processes == 2 and out["bf16"].steps == 18
    assert (
        out["bf16"]
        .notes[-1]
        .endswith("; 2 fresh processes are not pooled (no split of every plan came back)")
    )
    assert len(by_process(HERE, [partial, FRESH, {}], "fp32")["bf16"]) == 2
    assert "not pooled" not in pooled(HERE, [FRESH])["bf16"].notes[-1]


def test_the_fresh_processes_splits_are_read_with_their_timed_medians() -> None:
    def process(i: int, item: dict | None, blocks: list[list[float]]) -> types.SimpleNamespace:
        plans = {"fp32": PlanTiming("fp32", None, blocks), "bf16": PlanTiming("bf16", None, [])}
        return types.SimpleNamespace(index=i, plans=plans, time_split=item)

    sent = {"fp32": to_json(FRESH["fp32"][0]), "bf16": to_json(FRESH["bf16"][0])}
    gone = {"fp32": to_json(TimeSplit("fp32", missing="the profiled steps failed"))}
    measurement = types.SimpleNamespace(
        processes=[
            process(2, sent, [[2.0, 4.0, 3.0]]), process(3, None, [[1.0]]),
            process(4, gone, [[1.0]]),
        ]
    )  # fmt: skip
    found, unsent = from_processes(measurement)
    # bf16 was not timed in the first process, the second sent nothing, the third a missing split
    assert [set(f) for f in found] == [{"fp32"}, set(), set()]
    split, median = found[0]["fp32"]
    assert median == 3.0 and split.traced == FRESH["fp32"][0].traced
    # a split a process could not make is said, with its reason (the comparison's warnings)
    assert unsent == ["fresh process 4, fp32: the profiled steps failed"]


@dataclass
class Calibrated:
    estimate: float
    low: float
    high: float


def test_a_pooled_split_is_held_against_the_calibrated_speedup_and_names_its_processes() -> None:
    out = pooled(HERE, [FRESH])
    spread = by_process(HERE, [FRESH], "fp32")["bf16"]
    d = difference(out["fp32"], out["bf16"], Calibrated(1.55, 1.5, 1.6), by_process=spread)
    assert d.agrees is True and d.by_process == spread
    assert d.reconcile.startswith(
        "reconstructed from the families pooled over 2 processes: 1.538× (single processes "
        "1.40–1.67), within the calibrated 1.550× (1.500–1.600) widened by ±10 %"
    )
    off = difference(out["fp32"], out["bf16"], Calibrated(2.0, 1.9, 2.1), by_process=spread)
    assert off.agrees is False and "does not add up" in off.reconcile


def test_a_comparison_over_fresh_processes_pools_their_splits() -> None:
    from precision_nb import compare

    comparison = compare(
        ("fp32", "bf16"), "mlp", "tiny", time_split=True, progress=False, steps=8,
        measure=MeasureConfig(processes=2, rounds=2),
    )  # fmt: skip
    sent = comparison.measurement.processes[0].time_split
    assert set(sent) == {"fp32", "bf16"}
    assert sent["bf16"]["split"]["steps"] == PROCESS_SPLIT.steps
    split = comparison.time_split.splits["bf16"]
    assert split.processes == 2 and split.steps == 2 * PROCESS_SPLIT.steps  # as many here
    diff = comparison.time_split.differences["bf16"]
    assert len(diff.by_process) == 2 and diff.process is None  # held against the calibrated one
    assert "pooled over 2 processes" in diff.reconcile
    said = [e.message for e in comparison.events if e.message.startswith("time split:")]
    assert said and said[0].startswith(
        "time split: 6 profiled steps per plan after the timed rounds here, and 6 in the fresh "
        "process"
    )
