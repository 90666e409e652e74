"""Fresh processes start two at a time: the second imports beside the first, then waits, idle."""

from __future__ import annotations

import os
import threading

import pytest

from precision_nb.engine import measure_processes as MP
from precision_nb.engine import process_start
from precision_nb.engine.compare import compare
from precision_nb.engine.measure import MeasureConfig


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


class Recording(process_start.Starts):
    """The product's starts, with every process it started kept for the test to look at."""

    made: list[Recording] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started: list[process_start._Process] = []
        Recording.made.append(self)

    def _start(self, stderr, spec=None):
        child = super()._start(stderr, spec)
        self.started.append(child)
        return child


@pytest.fixture
def recording(monkeypatch):
    Recording.made = []
    monkeypatch.setattr(process_start, "Starts", Recording)
    return Recording.made


def _compare(processes):
    cfg = MeasureConfig(rounds=2, warmup_min=2, warmup_max=3, processes=processes)
    return compare(
        ["fp32", "bf16"], "mlp", "tiny", steps=4, log_every=4, progress=False, measure=cfg
    )


def test_the_second_fresh_process_imports_beside_the_first_and_measures_next(recording):
    out = _compare(3)
    m = out.measurement
    assert m.process_count == 3, m.events
    (starts,) = recording
    assert starts.paired == (len(os.sched_getaffinity(0)) >= 2)
    first, second = m.processes
    assert first.pid != second.pid and os.getpid() not in (first.pid, second.pid)
    assert 0 < first.startup_s < first.seconds
    if starts.paired:  # two started at once, the second given the next run file
        assert [c.pid for c in starts.started] == [first.pid, second.pid]
        assert starts.how == process_start.HOW
        assert second.seconds < first.seconds  # it had imported before its turn
        assert 0 < second.startup_s < first.seconds  # and its wait is not its start-up
    for fresh in (first, second):
        for label in ("fp32", "bf16"):
            assert [len(b) for b in fresh.plans[label].blocks] == [2, 2]
    assert second.orders[0] == ["fp32", "bf16"] and first.orders[0] == ["bf16", "fp32"]
    (rate,) = [e for e in m.events if "per_second" in e.data]
    assert rate.data["start"] == starts.how and rate.data["fresh_processes"] == 2
    assert not any(_alive(c.pid) for c in starts.started)


def test_a_standby_left_unused_is_ended(recording):
    out = _compare(2)
    assert out.measurement.process_count == 2
    (starts,) = recording
    if not starts.paired:
        pytest.skip("one CPU: no process is started ahead")
    assert len(starts.started) == 2 and starts.standby is None  # closed
    assert not any(_alive(c.pid) for c in starts.started)


def test_a_standby_told_nothing_ends_without_measuring(tmp_path):
    starts = process_start.Starts(MP._worker_env(), cpus=2)
    child = starts._start(tmp_path / "standby.err")
    assert child.wait_ready()
    child.proc.stdin.close()  # the end of its input: nothing to measure
    assert child.poll(60) == 0
    assert not list(tmp_path.glob("*.json"))


def test_a_standby_that_does_not_get_ready_leaves_its_run_file_to_a_new_process(
    monkeypatch, tmp_path
):
    made = []

    class Fake:
        def __init__(self, spec):
            self.spec, self.pid, self.ended = spec, len(made), False

        def wait_ready(self, stop=None):
            return False  # died while importing

        def end(self):
            self.ended = True

    starts = process_start.Starts({}, cpus=2)

    def start(stderr, spec=None):
        made.append(Fake(spec))
        return made[-1]

    monkeypatch.setattr(starts, "_start", start)
    child = starts.launch(tmp_path / "spec1.json", tmp_path / "process1.err")
    assert [m.spec for m in made] == [None, None, tmp_path / "spec1.json"]
    assert made[0].ended and made[1].ended and child is made[2]
    assert not starts.ready and not starts.last_was_ready


def test_a_stop_ends_the_wait_for_imports(tmp_path):
    stop = threading.Event()
    stop.set()
    starts = process_start.Starts(MP._worker_env(), stop, cpus=2)
    child = starts._start(tmp_path / "standby.err")
    try:
        assert child.wait_ready(stop) is False  # at once, not after the imports
    finally:
        child.end()
    assert not _alive(child.pid)


def test_one_cpu_starts_one_process_at_a_time():
    starts = process_start.Starts({}, cpus=1)
    assert not starts.paired and starts.how == process_start.HOW_ALONE
