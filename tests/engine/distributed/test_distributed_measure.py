"""A distributed profile's measurement: every plan in one torchrun launch (2 CPU ranks, gloo),
warm-up agreed over the ranks, rounds rotated, the slowest rank per step, training unchanged.

One measured launch (fp32 and bf16 under DDP) and one plain ``fit_distributed`` of bf16 are
shared by the tests of this module; the FSDP2 profile is a launch of its own.
"""

from __future__ import annotations

import pytest

from precision_nb.core.distributed import Distributed
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine import verdicts
from precision_nb.engine.distributed import fit_distributed
from precision_nb.engine.distributed.measured import (
    measure_distributed,
    merge_measurement,
    slowest_per_step,
)
from precision_nb.engine.measure import MeasureConfig

STEPS, ROUNDS = 12, 6  # 6 rounds: the fewest a 95 % interval over one launch's rounds needs
MLP_TINY_PARAMS = (64 * 128 + 128) + (128 * 128 + 128) + (128 * 10 + 10)


class Phases:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_phase(self, text: str) -> None:
        self.seen.append(text)


@pytest.fixture(scope="module")
def phases():
    return Phases()


@pytest.fixture(scope="module")
def measured(phases):
    return measure_distributed(
        "mlp",
        plans={"fp32": PrecisionConfig("fp32"), "bf16": PrecisionConfig("bf16")},
        distributed=Distributed("ddp", 2, timeout_s=180),
        device="cpu",
        measure=MeasureConfig(rounds=ROUNDS, warmup_max=6),
        callbacks=[phases],
        steps=STEPS,
        log_every=1,
        measure_peak=False,
    )


def test_one_launch_measures_both_plans_like_one_process(measured) -> None:
    m = measured.measurement
    assert m.orders == [["fp32", "bf16"], ["bf16", "fp32"]] * 3  # rotated every round
    assert m.sizes == [2] * ROUNDS
    for label in ("fp32", "bf16"):
        timing = m.plans[label]
        assert timing.failed is None and timing.rounds_completed == ROUNDS
        assert [len(b) for b in timing.blocks] == m.sizes
        assert (
            1 <= timing.warmup.steps <= 6 and "on each of the 2 ranks, agreed" in timing.warmup.rule
        )
        assert any(
            e.message.startswith(f"{label}: first {timing.warmup.steps} step(s)") for e in m.events
        )
    speed = m.speedup("bf16", "fp32")
    assert (
        speed.rounds == ROUNDS and speed.has_interval and speed.low <= speed.estimate <= speed.high
    )
    assert verdicts.verdict("bf16", speed).kind in ("faster", "slower", "unresolved")
    assert speed.level == "rounds" and "one torchrun launch" in speed.stopped_by
    # the verdict says what was measured (one launch, not "one process") and the machine load
    said = str(verdicts.verdict("bf16", speed))
    assert f"{ROUNDS} rounds in one torchrun launch" in said and "one process" not in said
    assert "several processes" not in said
    assert m.load is not None and any("load" in e.data for e in m.events)


def test_the_ranks_stop_each_warm_up_at_the_same_step(measured) -> None:
    ranks = measured.ranks
    assert len(ranks) == 2 and all(r is not None for r in ranks)
    for label in ("fp32", "bf16"):
        steps = [r["plans"][label]["warmup"]["steps"] for r in ranks]
        assert steps[0] == steps[1] == measured.measurement.plans[label].warmup.steps


def test_each_step_takes_the_slowest_rank_s_time(measured) -> None:
    for label, timing in measured.measurement.plans.items():
        rank_blocks = [r["plans"][label]["blocks"] for r in measured.ranks]
        for r, merged in enumerate(timing.blocks):
            assert merged == [max(a, b) for a, b in zip(*(b[r] for b in rank_blocks), strict=True)]
        assert measured.results[label].timed_steps[1] == [t for b in rank_blocks[1] for t in b]


def test_progress_names_each_phase_as_it_starts(measured, phases) -> None:
    assert phases.seen[0] == "warm-up of fp32"
    assert "warm-up of bf16" in phases.seen
    assert [p for p in phases.seen if p.startswith("round")] == [
        f"round {r}/{ROUNDS}" for r in range(1, ROUNDS + 1)
    ]


def test_each_plan_counts_only_its_own_collectives(measured) -> None:
    for label in ("fp32", "bf16"):
        rows = [r for r in measured.results[label].comm_table() if r["op"] == "all_reduce"]
        # one fp32 all-reduce of every gradient per step: the other plan's and the warm-up's
        # collectives went to other groups
        assert {(r["rank"], r["dtype"]): r["bytes_per_step"] for r in rows} == {
            (0, "fp32"): 4 * MLP_TINY_PARAMS,
            (1, "fp32"): 4 * MLP_TINY_PARAMS,
        }


def test_interleaving_does_not_change_training(measured) -> None:
    plain = fit_distributed(
        "mlp",
        distributed=Distributed("ddp", 2, timeout_s=180),
        device="cpu",
        precision="bf16",
        steps=STEPS,
        log_every=1,
        measure_peak=False,
    )
    one = [r["loss"] for r in plain.records]
    interleaved = [r["loss"] for r in measured.results["bf16"].records]
    assert len(interleaved) == STEPS
    assert interleaved == pytest.approx(one, rel=1e-5, abs=1e-6)


def test_merging_takes_the_per_step_maximum_and_drops_a_round_missing_on_a_rank() -> None:
    assert slowest_per_step([[1.0, 5.0], [2.0, 3.0]]) == ([2.0, 5.0], False)
    assert slowest_per_step([[1.0, 5.0], []]) == ([], False)
    assert slowest_per_step([[1.0, 5.0], [2.0]]) == ([2.0], True)
    warm = {"steps": 3, "seconds": 0.5, "rule": "stable: x", "times": [3.0, 1.0, 1.0]}

    def line(blocks, seconds):
        return {
            "sizes": [2, 2],
            "orders": [["a"], ["a"]],
            "stopped": False,
            "plans": {"a": {"warmup": dict(warm, seconds=seconds), "blocks": blocks}},
        }

    m = merge_measurement(
        [line([[1.0, 1.0], [4.0, 1.0]], 0.5), line([[2.0, 1.0], []], 0.7)],
        MeasureConfig(rounds=2),
        ["a"],
    )
    assert m.plans["a"].blocks == [[2.0, 1.0], []]
    assert m.plans["a"].warmup.seconds == 0.7 and m.plans["a"].warmup.steps == 3
    assert m.plans["a"].rounds_completed == 1
    missing = merge_measurement([line([[1.0, 1.0], [1.0, 1.0]], 0.5), None], MeasureConfig(), ["a"])
    assert missing.stopped and missing.plans["a"].blocks == [[], []]


def test_an_fsdp2_profile_is_measured_with_an_interval() -> None:
    from precision_nb.views.report.profile import profile

    p = profile(
        "mlp",
        compare="fp32,bf16",
        device="cpu",
        steps=6,
        rounds=6,
        distributed=Distributed("fsdp2", 2, timeout_s=180),
        inspect=False,
        numerics=False,
        progress=False,
    )
    bf16 = p.comparison.outcomes["bf16"]
    assert bf16.timing.rounds == 6 and bf16.timing.warmup.steps >= 1
    assert bf16.speedup.low is not None
    assert bf16.verdict.kind in ("faster", "slower", "unresolved")
    assert "slowest rank" in p.comparison.method["distributed step time"]
    for outcome in p.comparison.outcomes.values():  # FSDP2's all-gathers and reduce-scatters
        split = outcome.time_split
        assert split.available and split.families["communication"] > 0, split.missing
        assert any(name.startswith("c10d::") for name, _ in split.ops["communication"])
    bf16 = p.distributed["bf16"]
    assert bf16.ranks[0].sharding["dtensor_parameters"] > 0
    assert bf16.ranks[0].compute["weight_dtype"] == "bf16"
    gathers = {r["dtype"] for r in bf16.comm_table() if r["op"] == "all_gather"}
    assert gathers == {"bf16"}
