"""The speedup intervals mean what they say: simulated comparisons, thousands at once.

With identical plans every "faster" / "slower" verdict is false: at most 5 % of them may come
out (within Monte-Carlo error: 3 standard errors at 2,000 comparisons) at every round count and
number of processes offered, for each step-time shape a shared machine produces. The same
simulation with a true 1.3x speedup must resolve it often (power), so a method that never
resolves anything fails here too. benchmarks/bench_calibration.py prints all these rates.
"""

from __future__ import annotations

import pytest

from precision_nb.engine import stats
from precision_nb.engine.calibration import SCENARIOS, simulate, verdict_rates
from precision_nb.engine.signed_rank import hodges_lehmann

TRIALS = 2000
STEPS = 3  # steps per block
#: Allowed false-verdict rate: 5 % plus three Monte-Carlo standard errors.
LIMIT = 0.05 + 3 * (0.05 * 0.95 / TRIALS) ** 0.5

#: Rounds per process a user can ask for in one process (fewer give no interval at all).
ROUNDS_OFFERED = (6, 7, 8, 9, 10, 12, 16, 24, 32, 48)
#: (processes, rounds per process) measured with a fixed number of processes.
FIXED_OFFERED = ((2, 1), (2, 8), (3, 2), (3, 8), (4, 4), (5, 8), (8, 2), (8, 8))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_one_process_false_verdicts_stay_within_five_percent(scenario):
    for rounds in ROUNDS_OFFERED:
        base, plan = simulate(scenario, TRIALS, 1, rounds, STEPS, seed=rounds)
        rates = verdict_rates(base, plan, "rounds")
        assert rates.trials == TRIALS
        assert rates.resolved <= LIMIT, (scenario, rounds, rates)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("process_sd", [0.0, 0.15])
def test_fixed_processes_false_verdicts_stay_within_five_percent(scenario, process_sd):
    for processes, rounds in FIXED_OFFERED:
        seed = 100 * processes + rounds + int(process_sd * 1000)
        base, plan = simulate(scenario, TRIALS, processes, rounds, STEPS, 1.0, process_sd, seed)
        rates = verdict_rates(base, plan, "fixed")
        assert rates.resolved <= LIMIT, (scenario, processes, rounds, process_sd, rates)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("process_sd", [0.0, 0.03, 0.15])
def test_the_target_driven_procedure_keeps_its_coverage(scenario, process_sd):
    # stopping when the interval is narrow favours samples whose spread came out small: the
    # per-look level (stats.LOOK_CONFIDENCE) is what keeps the whole procedure within 5 %
    for most in (5, 10):
        base, plan = simulate(scenario, TRIALS, most, 8, STEPS, 1.0, process_sd, seed=most)
        rates = verdict_rates(base, plan, "target", target=0.05)
        assert stats.MIN_PROCESSES <= rates.processes <= most
        assert rates.resolved <= LIMIT, (scenario, most, process_sd, rates)


def test_without_the_per_look_level_the_target_procedure_would_not_hold():
    # the reason for LOOK_CONFIDENCE: the same looks at a plain 95 % miss their promise
    base, plan = simulate("lognormal", TRIALS, 10, 8, STEPS, 1.0, 0.03, seed=7)
    d = stats.np.log(stats.np.median(base, axis=-1) / stats.np.median(plan, axis=-1))
    m = hodges_lehmann(d)
    stop = stats.first_stop(m, 0.05, confidence=0.95)
    stop = stats.np.where(stop == 0, 10, stop)
    false = 0
    for p in set(stop.tolist()):
        rows = stop == p
        _, low, high = stats.process_interval(m[rows, :p], 0.95)
        false += int((stats.classify(low, high) != 0).sum())
    assert false / TRIALS > 0.05 + 2 * (0.05 * 0.95 / TRIALS) ** 0.5
    assert verdict_rates(base, plan, "target").resolved <= LIMIT


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_true_speedup_of_1_3_is_resolved(scenario):
    base, plan = simulate(scenario, TRIALS, 1, 8, STEPS, effect=1.3, seed=11)
    assert verdict_rates(base, plan, "rounds").faster >= 0.9
    base, plan = simulate(scenario, TRIALS, 8, 8, STEPS, 1.3, process_sd=0.1, seed=12)
    rates = verdict_rates(base, plan, "target")
    assert rates.faster >= 0.9 and rates.slower == 0.0


def test_the_simulation_runs_the_product_statistics():
    # one simulated comparison through the code the measurement uses gives the same verdict
    base, plan = simulate("outliers", 1, 4, 8, STEPS, effect=1.3, process_sd=0.1, seed=3)
    per = [(base[0, p].tolist(), plan[0, p].tolist()) for p in range(4)]
    s = stats.process_speedup(per)
    rates = verdict_rates(base, plan, "fixed")
    assert (s.low > 1) == (rates.faster == 1.0)
    with pytest.raises(ValueError, match="scenario"):
        simulate("nope", 1, 1, 1, 1)
