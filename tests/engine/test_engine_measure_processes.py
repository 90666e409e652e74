"""Measuring in several processes: the rules that add processes and say what stopped them.

The loop's rules are driven with scripted sessions and a stand-in for the worker process (known
answers, no process started); one test starts real fresh processes on a tiny workload.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from test_engine_measure import Scripted

from precision_nb.engine import measure_processes as MP
from precision_nb.engine import stats, verdicts
from precision_nb.engine.measure import MeasureConfig, PlanSpec, PlanTiming, ProcessTiming

PLANS = [PlanSpec("fp32"), PlanSpec("bf16")]
SPEC = MP.WorkerSpec({"workload": "mlp", "preset": "tiny"}, "cpu", {}, None, tuple(PLANS), 8, 1)


def _sessions(bf16_time=1.0):
    return lambda label, steps, warmup: Scripted(lambda k: 1.3 if label == "fp32" else bf16_time)


class Workers:
    """Stands in for ``_run_worker``: each call is one fresh process with the given ratios."""

    def __init__(self, ratios, fail_at=None, seconds=0.0):
        self.ratios, self.fail_at, self.seconds, self.calls = list(ratios), fail_at, seconds, 0

    def __call__(self, rebuild, cfg, index, deadline, folder, stop, starts):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            return None, "exit code 1: ImportError: no module named x", self.seconds
        ratio = self.ratios[(self.calls - 1) % len(self.ratios)]
        plans = {
            "fp32": PlanTiming("fp32", None, [[ratio]] * cfg.rounds),
            "bf16": PlanTiming("bf16", None, [[1.0]] * cfg.rounds),
        }
        return (
            ProcessTiming(index + 1, plans, [1] * cfg.rounds, seconds=self.seconds),
            "",
            self.seconds,
        )


def _measure(monkeypatch, workers, cfg, **kw):
    monkeypatch.setattr(MP, "_run_worker", workers)
    return MP.measure(PLANS, _sessions(), 4, cfg, rebuild=SPEC, baseline="fp32", **kw)


def test_fresh_processes_are_added_until_the_target(monkeypatch):
    workers = Workers([1.30, 1.31, 1.29, 1.30])
    cfg = MeasureConfig(rounds=4, warmup_max=0, processes=None, target=0.05, budget_s=None)
    m, sessions, failures = _measure(monkeypatch, workers, cfg)
    assert m.process_count == stats.MIN_PROCESSES and workers.calls == 2
    assert m.stopped_by.startswith("target: every interval within ±5 % after 3 processes")
    assert m.sequential and set(sessions) == {"fp32", "bf16"} and not failures
    s = m.speedup("bf16", "fp32")
    assert s.level == "processes" and s.processes == 3 and s.low > 1
    assert "97.5 % t quantile" in s.method
    assert m.load is not None and any(
        "machine load" in e.message or e.kind == "warning" for e in m.events
    )


class Clock:
    """The multi-process loop's clock only: ``advance`` moves it (a worker's run time)."""

    def __init__(self, start=0.0):
        self.now = start

    def perf_counter(self):
        return self.now

    @staticmethod
    def time():
        import time

        return time.time()


def test_a_target_out_of_reach_stops_at_the_budget_and_says_so(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(MP, "time", clock)
    monkeypatch.setattr(MP, "STARTUP_GUESS_S", 0.0)
    workers = Workers([2.0, 0.8, 1.6, 1.0], seconds=15.0)

    def fifteen_seconds_each(*args):
        clock.now += 15.0
        return workers(*args)

    cfg = MeasureConfig(rounds=4, warmup_max=0, processes=None, target=0.05, budget_s=60.0)
    m, _, _ = _measure(monkeypatch, fifteen_seconds_each, cfg)
    assert m.process_count == 5 and workers.calls == 4  # 4 x 15 s fill the 60 s
    assert m.stopped_by.startswith("budget: 60 s; another process (about 15 s) did not fit")
    assert "5 processes measured" in m.stopped_by and "target ±5 %" in m.stopped_by
    assert m.sequential  # looks were taken from the third process on: 97.5 % per look


def test_processes_asked_for_but_cut_by_a_budget_say_both_numbers(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(MP, "time", clock)
    monkeypatch.setattr(MP, "STARTUP_GUESS_S", 0.0)
    workers = Workers([1.25, 1.35, 1.3], seconds=15.0)

    def fifteen_seconds_each(*args):
        clock.now += 15.0
        return workers(*args)

    cfg = MeasureConfig(rounds=4, warmup_max=0, processes=8, budget_s=40.0)
    m, _, _ = _measure(monkeypatch, fifteen_seconds_each, cfg)
    assert m.process_count == 3  # 2 x 15 s fit the 40 s; a third fresh one would not
    assert "3 of the 8 processes asked measured" in m.stopped_by
    assert m.method()["measurement stopped by"] == m.stopped_by


def test_a_fixed_number_of_processes_is_measured_at_95_percent(monkeypatch):
    workers = Workers([1.25, 1.35])
    cfg = MeasureConfig(rounds=4, warmup_max=0, processes=3, budget_s=None)
    m, _, _ = _measure(monkeypatch, workers, cfg)
    assert m.process_count == 3 and m.stopped_by.startswith("3 processes, as asked")
    assert not m.sequential and "97.5" not in m.speedup("bf16", "fp32").method


def test_a_failing_fresh_process_is_an_event_and_ends_the_additions(monkeypatch):
    workers = Workers([1.3], fail_at=2)
    cfg = MeasureConfig(rounds=4, warmup_max=0, processes=None, budget_s=None)
    m, _, _ = _measure(monkeypatch, workers, cfg)
    assert (
        m.process_count == 2 and "a fresh process failed (exit code 1: ImportError" in m.stopped_by
    )
    assert any(e.kind == "warning" and "process 3 failed" in e.message for e in m.events)
    assert m.speedup("bf16", "fp32").level == "processes"  # over the 2 that finished


def test_a_stop_request_ends_the_additions(monkeypatch):
    stop = threading.Event()

    def stopping(*args):
        stop.set()
        return Workers([1.3])(*args)

    cfg = MeasureConfig(rounds=4, warmup_max=0, processes=None, budget_s=None)
    m, _, _ = _measure(monkeypatch, stopping, cfg, stop=stop)
    assert m.stopped and m.stopped_by == "stopped on request after 2 processes"


@pytest.mark.parametrize(
    ("cfg", "rebuild", "reason", "said"),
    [
        (MeasureConfig(processes=1), SPEC, "", "one process, as asked (processes=1)"),
        (
            MeasureConfig(processes=None),
            None,
            "workload 'x' is not built in",
            "one process, measured here: workload 'x' is not built in",
        ),
    ],
)
def test_one_process_says_why(monkeypatch, cfg, rebuild, reason, said):
    monkeypatch.setattr(MP, "_run_worker", lambda *a: pytest.fail("no process may start"))
    m, _, _ = MP.measure(PLANS, _sessions(), 6, cfg, rebuild=rebuild, single_reason=reason)
    assert m.process_count == 1 and m.stopped_by.startswith(said)
    assert m.speedup("bf16", "fp32").stopped_by == m.stopped_by


def test_what_a_fresh_process_cannot_rebuild_is_named_and_objects_travel_by_value():
    from torch import nn

    from precision_nb.engine.train_config import TrainConfig

    common = dict(
        preset="tiny", device="cpu", train=TrainConfig(), optimizer=None, plans={}, initial=None
    )
    spec, why = MP.rebuild_spec(
        workload="mlp", user_model=False, batches=None, loss_fn=None, **common
    )
    assert spec is not None and spec.model == {"workload": "mlp", "preset": "tiny"} and why == ""
    assert spec.shipped is None
    spec, why = MP.rebuild_spec(
        workload="nope", user_model=False, batches=None, loss_fn=None, **common
    )
    assert (
        spec is None
        and why == "workload 'nope' is not built in, so a fresh process cannot build it"
    )
    model = nn.Linear(2, 2)
    spec, why = MP.rebuild_spec(
        workload=None, user_model=True, batches=[1], loss_fn=len, **dict(common, initial=model)
    )  # a model object of this process: sent by value, with its batches and loss
    assert spec.model == {"sent": True} and why == ""
    assert spec.shipped == {"model": model, "batches": [1], "loss_fn": len}
    spec, _ = MP.rebuild_spec(
        workload="mlp", user_model=False, batches=[2], loss_fn=None, **common
    )  # a workload's own batches are sent, its model is rebuilt by name
    assert spec.model["workload"] == "mlp" and spec.shipped == {"batches": [2]}
    spec, _ = MP.rebuild_spec(
        workload=None, user_model=True, batches=[1], loss_fn=None, model_spec=("m:f", "m:b"),
        **dict(common, initial=nn.Linear(2, 2)),
    )  # fmt: skip
    assert spec.model == {"factory": "m:f", "batches": "m:b"} and spec.initial is not None
    assert spec.shipped is None


def test_a_model_that_cannot_travel_is_measured_here_and_the_verdict_says_why(
    monkeypatch, make_model, batches
):
    """A parametrized module (torch's weight_norm) refuses to be pickled: no fresh process
    starts, the result records why, and the verdict repeats it."""
    from torch.nn.utils.parametrizations import weight_norm

    from precision_nb.engine.compare import compare

    monkeypatch.setattr(MP, "_run_worker", lambda *a: pytest.fail("no process may start"))
    model = make_model()
    weight_norm(model[0])
    cfg = MeasureConfig(rounds=6, warmup_min=2, warmup_max=2, processes=None, budget_s=None)
    out = compare(["fp32", "bf16"], model=model, batches=batches, steps=6, log_every=6,
                  progress=False, measure=cfg)  # fmt: skip
    m = out.measurement
    why = (
        "the model cannot be pickled for a fresh process (RuntimeError: Serialization of "
        "parametrized modules is only supported through state_dict(). See: https://"
    )
    assert m.process_count == 1 and m.stopped_by.startswith(f"one process, measured here: {why}")
    assert any(e.data.get("measured_here", "").startswith(why) for e in m.events)
    verdict = out.outcome("bf16").verdict.text
    assert verdict.count("measured here: the model cannot be pickled") == 1
    assert "rounds in one process, which does not cover process-to-process" in verdict


def test_a_lock_in_the_batches_is_named_as_what_cannot_travel(tmp_path):
    import threading

    from precision_nb.engine import shipping

    class Guarded:  # batches that guard a cursor with a lock
        def __init__(self):
            self.lock = threading.Lock()

    with pytest.raises(
        shipping.CannotShip,
        match=r"^the batches cannot be pickled for a fresh process \(TypeError: ",
    ):
        shipping.pack(tmp_path, {"model": [1], "batches": Guarded()})
    assert not (tmp_path / "batches.pt").exists()
    with pytest.raises(ValueError, match=r"objects: \['weights'\] cannot be shipped"):
        shipping.pack(tmp_path, {"weights": 1})


def test_what_did_not_load_in_the_first_fresh_process_is_measured_here(monkeypatch):
    def not_received(*args):
        return None, f"{MP.NOT_RECEIVED} (ModuleNotFoundError: No module named 'gone')", 1.0

    cfg = MeasureConfig(rounds=4, warmup_max=0, processes=None, budget_s=None)
    m, _, _ = _measure(monkeypatch, not_received, cfg)
    assert m.process_count == 1 and m.stopped_by.startswith(
        f"one process, measured here: {MP.NOT_RECEIVED} (ModuleNotFoundError"
    )
    assert any(e.kind == "warning" and "process 2 failed" in e.message for e in m.events)


def test_each_plan_is_measured_in_fresh_processes_too():
    import os

    from precision_nb.engine import process_start
    from precision_nb.engine.compare import compare

    cfg = MeasureConfig(rounds=2, warmup_min=2, warmup_max=3, processes=2)
    out = compare(
        ["fp32", "bf16"], "mlp", "tiny", steps=4, log_every=4, progress=False, measure=cfg
    )
    m = out.measurement
    assert m.process_count == 2, m.events
    (fresh,) = m.processes
    assert fresh.pid not in (None, os.getpid())
    assert 0 < fresh.startup_s < fresh.seconds  # launch to warm-up, within launch to exit
    (rate,) = [e for e in m.events if "per_second" in e.data]
    assert rate.data["start"] == process_start.HOW and rate.data["fresh_processes"] == 1
    assert fresh.orders[0] == ["bf16", "fp32"]  # its rotation starts with the other plan
    for label in ("fp32", "bf16"):
        assert [len(b) for b in fresh.plans[label].blocks] == [2, 2]
        assert fresh.plans[label].warmup.steps >= 2
    bf16 = out.outcomes["bf16"]
    assert bf16.timing.processes == 2 and bf16.verdict.level == "processes"
    assert bf16.verdict.stopped_by.startswith("2 processes, as asked")
    assert out.results["bf16"].steps == 4  # this process's run is the one the report shows


def test_a_budget_spent_by_this_process_says_the_interval_covers_its_rounds_only(monkeypatch):
    cfg = MeasureConfig(rounds=8, warmup_max=0, processes=None, budget_s=40.0)
    clock = Clock()
    monkeypatch.setattr(MP, "time", clock)
    real = MP.measure_plans

    def slow_first_process(*args, **kwargs):
        clock.now += 45.0  # this process's measurement alone spends the budget
        return real(*args, **kwargs)

    monkeypatch.setattr(MP, "measure_plans", slow_first_process)
    monkeypatch.setattr(MP, "_run_worker", lambda *a: pytest.fail("no process fits"))
    m, _, _ = MP.measure(PLANS, _sessions(), 8, cfg, rebuild=SPEC, baseline="fp32")
    assert m.process_count == 1 and "no fresh process fit" in m.stopped_by
    v = verdicts.verdict("bf16", m.speedup("bf16", "fp32"))
    assert "8 rounds in one process, which does not cover process-to-process" in v.text
    assert v.stopped_by.endswith("the interval covers this process's rounds only")


def test_a_plan_failing_in_a_fresh_process_fails_that_process(tmp_path):
    """A fresh process whose plan failed sends no sample of that plan's speed: it counts as a
    failed process (the additions end), named with the plan and its error."""
    import json

    class Child:
        pid = 1
        launched = None

        def poll(self, timeout):
            return 0

    class Starts:
        def launch(self, spec, stderr):
            out = json.loads(spec.read_text())["out"]
            plan = {"warmup": None, "blocks": [], "failed": "NotImplementedError: no forward"}
            data = {"plans": {"fp32": plan, "bf16": dict(plan, failed=None)}, "sizes": [],
                    "orders": [], "pid": 1}  # fmt: skip
            Path(out).write_text(json.dumps(data))
            return Child()

    cfg = MeasureConfig(rounds=4, processes=2)
    timing, why, _ = MP._run_worker(SPEC, cfg, 1, None, tmp_path, None, Starts())
    assert timing is None and why == "plan fp32: NotImplementedError: no forward"
