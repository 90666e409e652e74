"""A distributed profile's time split: one torchrun launch of 2 CPU ranks (gloo, DDP) measures
fp32 and bf16, then every rank profiles a few steps of each plan; the launcher keeps the slowest
rank's split, with the collectives in the communication family, reconciled with the distributed
verdict's interval, and the report folder holds it like a profile in one process."""

from __future__ import annotations

import csv

import pytest

from precision_nb.core.distributed import Distributed
from precision_nb.engine.time_split import FAMILIES, SplitConfig


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    from precision_nb.views.report.profile import profile

    out = tmp_path_factory.mktemp("distributed-split")
    p = profile(
        "mlp", compare="fp32,bf16", device="cpu", steps=6, rounds=6,
        distributed=Distributed("ddp", 2, timeout_s=180), inspect=False, numerics=False,
        progress=False, out=out,
    )  # fmt: skip
    return p, out


def test_every_plan_has_a_split_whose_families_sum_to_its_step_with_communication(
    profiled,
) -> None:
    p, _ = profiled
    for label in ("fp32", "bf16"):
        outcome = p.comparison.outcomes[label]
        split = outcome.time_split
        assert split is p.time_split.splits[label]
        assert split.available, split.missing
        assert set(split.families) == set(FAMILIES) and split.steps == SplitConfig().steps
        assert sum(split.families.values()) == pytest.approx(split.step_s, rel=1e-9)
        assert split.profiler_s == 0 and split.families == split.traced  # the cost kept in
        assert split.step_s > 0 and split.families["communication"] > 0
        assert split.ops["communication"], "the collectives are named"
        assert split.families["matmul"] > 0
        # the step timer timed the same steps on the same rank: the families hold against it
        assert abs(split.sum_error) < 0.5
        # the profiler's cost is stated against the distributed median step time
        assert split.measured_s == outcome.timing.median and split.overhead is not None
        assert "slowest of the 2 ranks'" in split.notes[-1]


def test_the_split_is_reconciled_with_the_distributed_verdict(profiled) -> None:
    p, _ = profiled
    bf16 = p.comparison.outcomes["bf16"]
    diff = bf16.difference
    assert diff is not None and diff.missing is None
    assert (diff.calibrated, diff.low, diff.high) == (
        bf16.speedup.estimate, bf16.speedup.low, bf16.speedup.high,
    )  # fmt: skip
    fp32 = p.comparison.outcomes["fp32"].time_split
    assert diff.reconstructed == pytest.approx(fp32.step_s / bf16.time_split.step_s)
    assert diff.agrees in (True, False) and diff.sentence


def test_the_report_folder_holds_the_split(profiled) -> None:
    p, out = profiled
    with open(out / "time_by_family.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    comm = {r["run"]: float(r["ms_per_step"]) for r in rows if r["family"] == "communication"}
    assert set(comm) == {"fp32", "bf16"} and all(v > 0 for v in comm.values())
    assert not any(r["missing"] for r in rows)
    assert "communication" in p._repr_html_()
