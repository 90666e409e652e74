"""The interleaved runner and the warm-up rule, driven by scripted sessions (known answers)."""

from __future__ import annotations

import threading

import pytest

from precision_nb.engine import measure as M


class Scripted:
    """A session whose n-th step takes ``time_of(n)`` seconds; fails or runs dry when told."""

    def __init__(self, time_of, limit=None, fail_at=None, log=None, name=""):
        self.time_of, self.limit, self.fail_at = time_of, limit, fail_at
        self.log, self.name = log, name
        self.result = type("R", (), {})()
        self.result.step_times_s = []
        self.done = False

    def advance(self, n):
        made = 0
        for _ in range(n):
            k = len(self.result.step_times_s)
            if self.fail_at is not None and k == self.fail_at:
                raise RuntimeError("boom")
            if self.limit is not None and k >= self.limit:
                break
            self.result.step_times_s.append(self.time_of(k))
            made += 1
        if self.log is not None:
            self.log.append(self.name)
        return made

    def finish(self):
        self.done = True
        return self.result


def test_block_sizes_split_steps_evenly():
    assert M.block_sizes(10, 4) == [3, 3, 2, 2]
    assert M.block_sizes(3, None) == [1, 1, 1]  # the default rounds: one per step at most
    with pytest.raises(ValueError, match="rounds: invalid value 8 with steps=3"):
        M.block_sizes(3, 8)  # rounds asked for are kept or refused, never lowered
    assert sum(M.block_sizes(97, 8)) == 97


def test_warm_up_ends_when_step_times_settle():
    times = [10.0, 5.0, 2.0, 1.0, 1.05, 0.98, 1.0, 1.0]
    cfg = M.MeasureConfig(warmup_min=3, warmup_window=3, warmup_tolerance=0.1)
    warm = M.warm_up("bf16", Scripted(lambda k: times[k]), cfg)
    assert warm.steps == 6 and warm.rule.startswith("stable: 3 consecutive step times within 10%")
    assert warm.times == tuple(times[:6])


def test_warm_up_stops_at_the_cap_and_says_so():
    cfg = M.MeasureConfig(warmup_max=7, warmup_tolerance=0.1)
    warm = M.warm_up("fp32", Scripted(lambda k: 1.0 + (k % 2)), cfg)
    assert warm.steps == 7 and warm.rule == "cap: 7 steps without stabilising"


def test_warm_up_skipped_on_request():
    warm = M.warm_up("fp32", Scripted(lambda k: 1.0), M.MeasureConfig(warmup_max=0))
    assert warm.steps == 0 and warm.rule.startswith("none")


def test_batches_running_out_in_warm_up_is_a_clear_error():
    with pytest.raises(ValueError, match="batches ran out during the warm-up of plan bf16 after 2"):
        M.warm_up("bf16", Scripted(lambda k: 1.0 + k, limit=2), M.MeasureConfig())


def test_rounds_rotate_the_order_and_pair_the_blocks():
    log: list[str] = []
    sessions = {
        "fp32": Scripted(lambda k: 2.0, log=log, name="fp32"),
        "bf16": Scripted(lambda k: 1.0, log=log, name="bf16"),
        "fp16": Scripted(lambda k: 4.0, log=log, name="fp16"),
    }
    sizes = M.block_sizes(12, 4)
    rounds = M.run_rounds(sessions, sizes)
    assert rounds.failures == {} and rounds.failed == {}
    assert rounds.orders[0] == ["fp32", "bf16", "fp16"]
    assert rounds.orders[1] == ["bf16", "fp16", "fp32"]
    assert log[:6] == ["fp32", "bf16", "fp16", "bf16", "fp16", "fp32"]
    assert [len(b) for b in rounds.blocks["bf16"]] == [3, 3, 3, 3]
    m = _measurement(rounds, sizes)
    assert m.speedup("bf16", "fp32").estimate == pytest.approx(2.0)
    assert m.speedup("fp16", "fp32").estimate == pytest.approx(0.5)


def _measurement(rounds, sizes):
    plans = {k: M.PlanTiming(k, None, b, rounds.failed.get(k)) for k, b in rounds.blocks.items()}
    return M.Measurement(M.MeasureConfig(rounds=len(sizes)), list(sizes), plans, rounds.orders)


def test_a_fresh_process_starts_its_rotation_elsewhere():
    sessions = {k: Scripted(lambda k: 1.0) for k in ("fp32", "bf16", "fp16")}
    rounds = M.run_rounds(sessions, [1, 1], offset=2)
    assert rounds.orders == [["fp16", "fp32", "bf16"], ["fp32", "bf16", "fp16"]]


def test_a_plan_failing_part_way_keeps_its_completed_rounds():
    sessions = {
        "fp32": Scripted(lambda k: 2.0),
        "bf16": Scripted(lambda k: 1.0, fail_at=5),  # fails inside round 3 (blocks of 2)
    }
    sizes = [2, 2, 2, 2, 2]
    rounds = M.run_rounds(sessions, sizes)
    assert set(rounds.failures) == {"bf16"}
    m = _measurement(rounds, sizes)
    bf16 = m.plans["bf16"]
    assert bf16.rounds_completed == 2 and "failed in round 3: RuntimeError: boom" in bf16.failed
    assert m.plans["fp32"].rounds_completed == 5
    s = m.speedup("bf16", "fp32")
    assert s.rounds == 2 and s.low is None  # too few rounds for an interval
    assert any("2 round(s) it completed" in e.message for e in rounds.events)


def test_a_plan_running_dry_in_the_rounds_is_reported():
    sessions = {"fp32": Scripted(lambda k: 1.0), "bf16": Scripted(lambda k: 1.0, limit=5)}
    sizes = [2, 2, 2, 2]
    m = _measurement(M.run_rounds(sessions, sizes), sizes)
    assert m.plans["bf16"].failed == "batches ran out in round 3 after 1 of 2 steps"
    assert m.plans["bf16"].rounds_completed == 2


def test_a_stop_request_ends_the_rounds():
    stop = threading.Event()
    sessions = {"fp32": Scripted(lambda k: 1.0)}
    stop.set()
    rounds = M.run_rounds(sessions, [1, 1, 1], stop)
    assert rounds.stopped and len(rounds.orders) == 1


def test_measure_plans_warms_each_plan_on_a_throw_away_session():
    made: list[tuple[str, int, bool]] = []

    def make(label, steps, warmup):
        made.append((label, steps, warmup))
        return Scripted(lambda k: 1.0)

    m, sessions, failures = M.measure_plans(["fp32", "bf16"], make, 8, M.MeasureConfig(rounds=4))
    assert made == [("fp32", 20, True), ("bf16", 20, True), ("fp32", 8, False), ("bf16", 8, False)]
    assert all(len(s.result.step_times_s) == 8 for s in sessions.values())
    assert m.plans["fp32"].warmup.steps == 3 and not failures
    assert "rounds" in m.method()["method"]


def test_measure_config_refuses_bad_values():
    with pytest.raises(ValueError, match="measure.rounds"):
        M.MeasureConfig(rounds=0)


def test_a_plan_failing_in_warm_up_is_not_measured_and_the_others_are():
    def make(label, steps, warmup):
        return Scripted(lambda k: 1.0, fail_at=0 if label == "bf16" else None)

    m, sessions, failures = M.measure_plans(["fp32", "bf16"], make, 4, M.MeasureConfig(rounds=2))
    assert set(failures) == {"bf16"} and set(sessions) == {"fp32"}
    assert m.plans["bf16"].failed.startswith("failed in warm-up: RuntimeError: boom")
    assert m.plans["fp32"].rounds_completed == 2 and m.plans["bf16"].rounds_completed == 0


def test_measure_plans_reports_each_warm_up_to_on_warmup_as_it_starts_and_ends():
    seen: list[tuple[str, object]] = []

    def make(label, steps, warmup):
        seen.append((label, "session" if warmup else "measured"))
        return Scripted(lambda k: 1.0)

    def on_warmup(label, warm):
        seen.append((label, None if warm is None else warm.steps))

    m, _, _ = M.measure_plans(["fp32", "bf16"], make, 4, M.MeasureConfig(rounds=2), None, on_warmup)
    assert seen[:6] == [
        ("fp32", None), ("fp32", "session"), ("fp32", 3),
        ("bf16", None), ("bf16", "session"), ("bf16", 3),
    ]  # fmt: skip
    assert m.plans["bf16"].warmup.steps == 3


def _rank_times(settle_at):
    """Step times that settle (equal) from step ``settle_at`` on, falling steeply before it."""
    return lambda k: 1.0 if k >= settle_at else 2.0 ** (settle_at - k)


def _warm_ranks(settle, agree_for):
    """Warm-up of one plan on two simulated ranks (threads); agree_for(rank) -> agree or None."""
    cfg = M.MeasureConfig(warmup_max=15, warmup_seconds=60.0, warmup_tolerance=0.1)
    out: dict[int, M.Warmup] = {}

    def rank(r):
        out[r] = M.warm_up("bf16", Scripted(_rank_times(settle[r])), cfg, agree_for(r))

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_ranks_that_agree_end_the_warm_up_at_the_same_step():
    # Alone, rank 0 is stable after 3 steps and rank 1 after 7: their collectives would part.
    alone = _warm_ranks({0: 0, 1: 4}, lambda r: None)
    assert (alone[0].steps, alone[1].steps) == (3, 7)

    flags: list[bool] = [False, False]
    barrier = threading.Barrier(2, timeout=10)
    calls = {0: 0, 1: 0}

    def fake_all_reduce_min(r):
        def agree(done):
            calls[r] += 1
            flags[r] = done
            barrier.wait()
            decision = min(flags)  # what an all-reduce with MIN gives every rank
            barrier.wait()
            return decision

        return agree

    agreed = _warm_ranks({0: 0, 1: 4}, fake_all_reduce_min)
    assert agreed[0].steps == agreed[1].steps == 7 and calls == {0: 7, 1: 7}
    assert agreed[0].rule.startswith("stable") and agreed[1].rule.startswith("stable")


def test_a_rank_told_to_stop_before_its_own_rule_says_it_was_agreed():
    warm = M.warm_up("fp32", Scripted(_rank_times(10)), M.MeasureConfig(), lambda done: True)
    assert (
        warm.steps == 1
        and warm.rule == "agreed: the other processes ended the warm-up after 1 steps"
    )


def test_fail_fast_raises_a_failing_session_at_once_with_the_round_announced():
    sessions = {"fp32": Scripted(lambda k: 1.0), "bf16": Scripted(lambda k: 1.0, fail_at=3)}
    sizes = [2, 2, 2]
    rounds: list[tuple[int, int]] = []
    with pytest.raises(RuntimeError, match="boom"):
        M.run_rounds(sessions, sizes, fail_fast=True, on_round=lambda r, n: rounds.append((r, n)))
    # round 2 starts with bf16 (order rotated), which fails before fp32 runs its block
    assert rounds == [(1, 3), (2, 3)] and len(sessions["fp32"].result.step_times_s) == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"processes": 0}, "measure.processes: invalid value 0"),
        ({"processes": M.MAX_PROCESSES + 1}, "measure.processes"),
        ({"target": 0.0}, "measure.target: invalid value 0.0"),
        ({"target": 1.5}, "measure.target: invalid value 1.5"),
        ({"budget_s": 0}, "measure.budget_s: invalid value 0"),
        ({"budget_s": float("nan")}, "measure.budget_s"),
        ({"rebuild": ("pkg.mod:make", "no-colon")}, "measure.rebuild"),
    ],
)
def test_measure_config_names_a_bad_process_target_or_budget(options, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.", 1)):
        M.MeasureConfig(**options)


def test_plans_are_keyed_by_a_frozen_spec_and_the_measurement_is_returned():
    spec = M.PlanSpec("bf16", {"mode": "bf16"})
    with pytest.raises(AttributeError):
        spec.label = "x"  # frozen
    m, _, _ = M.measure_plans(
        [M.PlanSpec("fp32"), spec], lambda *a: Scripted(lambda k: 1.0), 4, M.MeasureConfig(rounds=2)
    )
    assert m.plans["bf16"].spec is spec and spec.to_dict()["precision"] == {"mode": "bf16"}
    assert len(m.orders) == 2 and m.seconds > 0


def test_a_budget_too_small_for_one_round_is_refused_with_the_minimum():
    cfg = M.MeasureConfig(rounds=2, budget_s=0.5)
    with pytest.raises(ValueError, match=r"too small for a single round.*at least 2\.00 s") as info:
        M.measure_plans(["fp32", "bf16"], lambda *a: Scripted(lambda k: 0.5), 4, cfg)
    assert "measure.budget_s" in str(info.value)  # 2 steps per plan x 0.5 s x 2 plans = 2 s
    fits = M.MeasureConfig(rounds=2, budget_s=2.5)  # warm-ups are not a round: they fit
    M.measure_plans(["fp32", "bf16"], lambda *a: Scripted(lambda k: 0.5), 4, fits)


def test_speedups_are_over_processes_once_fresh_processes_measured():
    rounds = [[1.0], [1.0], [1.0], [1.0]]
    m = M.Measurement(
        M.MeasureConfig(rounds=4),
        [1, 1, 1, 1],
        {
            "fp32": M.PlanTiming("fp32", None, [[2.0]] * 4),
            "bf16": M.PlanTiming("bf16", None, rounds),
        },
    )
    assert m.speedup("bf16", "fp32").level == "rounds"  # one process: too few rounds, no interval
    assert not m.speedup("bf16", "fp32").has_interval
    for i, base in enumerate((2.2, 1.8)):
        plans = {
            "fp32": M.PlanTiming("fp32", None, [[base]] * 4),
            "bf16": M.PlanTiming("bf16", None, rounds),
        }
        m.processes.append(M.ProcessTiming(i + 1, plans))
    s = m.speedup("bf16", "fp32")
    assert s.level == "processes" and s.processes == 3 and s.has_interval
    assert s.estimate == pytest.approx((2.0 * 2.2 * 1.8) ** (1 / 3)) and s.rounds == 12  # geometric
    assert m.spread("fp32").n == 12 and m.spread("fp32").median == pytest.approx(2.0)
    assert m.method()["processes"] == 3 and "over the 3 processes" in m.method()["speedup"]


def test_plan_timing_travels_as_json():
    timing = M.PlanTiming("bf16", M.Warmup(3, 0.2, "stable", (1.0, 0.5, 0.5)), [[0.5, 0.4], []])
    back = M.PlanTiming.from_dict("bf16", timing.to_dict())
    assert back.warmup == timing.warmup and back.blocks == timing.blocks and back.failed is None


def test_a_default_budget_is_not_refused_it_only_limits_the_fresh_processes():
    cfg = M.MeasureConfig(rounds=2, budget_s=0.5, refuse_small_budget=False)
    m, _, _ = M.measure_plans(["fp32", "bf16"], lambda *a: Scripted(lambda k: 0.5), 4, cfg)
    assert m.plans["bf16"].rounds_completed == 2  # this process completes its rounds anyway
