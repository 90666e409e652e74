"""The machine's load over a measurement: others' CPU share, stolen time, the busy note."""

from __future__ import annotations

import pytest

from precision_nb.engine.load import BUSY_SHARE, Load, LoadSample, sample


def _load(busy_s, own_s, steal_s=0.0, seconds=10.0, cpus=2):
    start = LoadSample(0.0, (1.0, 1.0, 1.0), cpus, 100.0, 5.0, 50.0)
    end = LoadSample(seconds, (3.0, 2.0, 1.0), cpus, 100.0 + busy_s, 5.0 + steal_s, 50.0 + own_s)
    return Load(start, end)


def test_others_share_is_the_machine_busy_time_not_ours():
    load = _load(busy_s=18.0, own_s=12.0)  # 6 of 20 CPU-seconds used by others
    assert load.others_share == pytest.approx(0.3) and load.busy
    assert load.note().startswith("The machine was busy while this was measured: other")
    assert "30%" in load.note() and "load average 1.0 at the start, 3.0 at the end" in load.note()


def test_a_quiet_machine_has_no_note_but_a_description():
    load = _load(busy_s=12.5, own_s=12.0)  # 0.5 of 20 CPU-seconds: background
    assert load.others_share < BUSY_SHARE and not load.busy and load.note() == ""
    assert "other processes used 2%" in load.describe()


def test_stolen_time_makes_a_machine_busy():
    load = _load(busy_s=12.0, own_s=12.0, steal_s=2.0)
    assert load.steal_share == pytest.approx(0.1) and load.busy
    assert load.to_dict()["busy"] is True


def test_a_real_sample_reads_this_machine():
    first = sample()
    sum(i * i for i in range(200_000))  # some CPU time of our own
    second = sample()
    assert second.own_s >= first.own_s and second.busy_s >= first.busy_s and first.cpus >= 1
    load = Load(first, second)
    assert 0.0 <= load.others_share <= 1.0 and 0.0 <= load.steal_share <= 1.0
