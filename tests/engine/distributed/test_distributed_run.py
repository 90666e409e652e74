"""Runs of 2 CPU processes under torchrun (gloo): the same training as one process, collective
bytes by dtype, FSDP2's bf16 compute over fp32 shards, the loss-scale lab, failures and cleanup.

Each test starts one torchrun (a few seconds of start-up); the fp32 DDP run is shared with the
other distributed tests (the ``one_node`` fixture of tests/engine/distributed/conftest.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
import torch
from dist_runs import STEPS, leftovers

from precision_nb import fit
from precision_nb.core.distributed import Distributed
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.distributed import DistributedError, DistributedResult, fit_distributed

MLP_TINY_PARAMS = (64 * 128 + 128) + (128 * 128 + 128) + (128 * 10 + 10)


def _run(strategy: str = "ddp", model: str = "mlp", **kw):
    dist_kw = {k: kw.pop(k) for k in list(kw) if k in ("comm_hook", "param_dtype")}
    return fit_distributed(
        model,
        kw.pop("batches", None),
        distributed=Distributed(strategy, 2, timeout_s=120, **dist_kw),
        device="cpu",
        steps=kw.pop("steps", STEPS),
        log_every=1,
        measure_peak=False,
        **kw,
    )


@pytest.fixture(scope="module")
def ddp_fp32(one_node):
    return (
        one_node.result
    )  # tests/engine/distributed/dist_runs.py: 2 processes, mlp tiny, STEPS steps


@pytest.fixture(scope="module")
def collector(one_node):
    return one_node.collector


def _bytes(result, op):
    rows = [r for r in result.comm_table() if r["op"] == op]
    return {(r["rank"], r["dtype"]): r["bytes_per_step"] for r in rows}


def test_ddp_on_two_ranks_trains_what_one_process_trains(ddp_fp32) -> None:
    single = fit("mlp", device="cpu", steps=STEPS, log_every=1, progress=False, measure_peak=False)
    one = [r["loss"] for r in single.records]
    two = [r["loss"] for r in ddp_fp32.records]
    assert len(two) == STEPS
    assert two == pytest.approx(one, rel=1e-5, abs=1e-6)
    # each rank trained a different half of the batch: their own losses differ
    assert ddp_fp32.ranks[0].records[0]["loss"] != ddp_fp32.ranks[1].records[0]["loss"]
    assert 0 < ddp_fp32.startup_s < ddp_fp32.seconds


def test_callbacks_follow_rank_0_and_see_the_result(ddp_fp32, collector) -> None:
    assert collector.logged == ddp_fp32.ranks[0].records
    assert collector.ended is ddp_fp32


def test_ddp_all_reduces_every_gradient_in_fp32_and_records_memory(ddp_fp32) -> None:
    assert _bytes(ddp_fp32, "all_reduce") == {
        (0, "fp32"): 4 * MLP_TINY_PARAMS,
        (1, "fp32"): 4 * MLP_TINY_PARAMS,
    }
    memory = {(m["rank"], m["kind"]): m["bytes"] for m in ddp_fp32.memory_table()}
    for rank in (0, 1):  # DDP: full replicas on each rank
        assert memory[rank, "parameters"] == memory[rank, "gradients"] == 4 * MLP_TINY_PARAMS
        assert memory[rank, "optimizer_state"] >= 2 * 4 * MLP_TINY_PARAMS  # AdamW's two moments


def test_bf16_compression_halves_the_all_reduce_bytes(ddp_fp32) -> None:
    bf16 = _run(comm_hook="bf16")
    assert _bytes(bf16, "all_reduce") == {
        (rank, "bf16"): b / 2 for (rank, _), b in _bytes(ddp_fp32, "all_reduce").items()
    }


def test_fsdp2_computes_in_bf16_over_fp32_sharded_master_parameters() -> None:
    result = _run("fsdp2", precision="bf16")
    assert result.plan.param_dtype == "bf16"
    for r in result.ranks:
        assert r.sharding["dtensor_parameters"] == r.sharding["parameters"] > 0
        assert r.sharding["master_dtypes"] == ["fp32"]
        assert r.sharding["local_numel"] * 2 == r.sharding["global_numel"]
        assert r.compute["weight_dtype"] == "bf16" and r.compute["weight_class"] != "DTensor"
        assert r.memory["parameters"] == {"fp32": 4 * MLP_TINY_PARAMS // 2}
    ops = {(row["op"], row["dtype"]) for row in result.comm_table()}
    assert {("all_gather", "bf16"), ("reduce_scatter", "fp32")} <= ops
    assert ("all_reduce", "fp32") not in ops


def test_fp16_loss_scale_lab_skips_the_same_step_on_every_rank() -> None:
    result = _run(
        model="dist_helpers:overflow_on_rank1",
        batches="dist_helpers:batches",
        precision=PrecisionConfig(mode="fp16", loss_scale_lab=True),
        steps=5,
    )
    skips = [[rec["skipped"] for rec in r.records] for r in result.ranks]
    scales = [[rec["loss_scale"] for rec in r.records] for r in result.ranks]
    assert any(skips[0]) and skips[0] == skips[1]
    assert scales[0] == scales[1] and min(scales[0]) < max(scales[0])


def _leftovers(run_dir: str) -> list[psutil.Process]:
    return leftovers(run_dir)


def test_a_rank_that_raises_ends_the_run_with_its_error_and_keeps_records() -> None:
    with pytest.raises(DistributedError, match="rank 1 raised ArithmeticError") as info:
        _run(model="dist_helpers:raise_on_rank1", batches="dist_helpers:batches", steps=8)
    err = info.value
    assert err.rank == 1 and "failed on purpose" in str(err)
    assert "dist_helpers.py" in str(err)  # where it was raised, not a frame inside torch
    assert not Path(err.result.run_dir).exists()  # the records travel in the error
    assert len(err.result.ranks[0].records) >= 1 and len(err.result.ranks[1].records) >= 1
    assert _leftovers(err.result.run_dir) == []


def test_a_killed_rank_ends_the_run_and_leaves_no_process_behind() -> None:
    with pytest.raises(DistributedError, match="rank 1 was killed by signal SIGKILL") as info:
        _run(model="dist_helpers:kill_rank1", batches="dist_helpers:batches", steps=8)
    result = info.value.result
    assert len(result.ranks[0].records) >= 1  # rank 0's records survive
    deadline = time.time() + 5
    while _leftovers(result.run_dir) and time.time() < deadline:
        time.sleep(0.1)
    assert _leftovers(result.run_dir) == []


def test_bad_requests_are_refused_before_any_process_starts(monkeypatch) -> None:
    from precision_nb.engine.distributed import process

    started = []
    monkeypatch.setattr(process.subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(ValueError, match="not divisible by distributed.nproc=3"):
        fit_distributed("mlp", distributed=Distributed("ddp", 3), device="cpu")
    with pytest.raises(ValueError, match="not divisible"):
        _run(model="dist_helpers:plain", batches="dist_helpers:odd_batches")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        fit_distributed("mlp", distributed=Distributed("ddp", 2), device="cuda")
    with pytest.raises(RuntimeError, match="nccl needs CUDA"):
        fit_distributed("mlp", distributed=Distributed("ddp", 2, backend="nccl"), device="cpu")
    with pytest.raises(ValueError, match="cannot be sent to torchrun workers"):
        fit_distributed(torch.nn.Linear(2, 2), [torch.zeros(2, 2)], distributed=Distributed())
    with pytest.raises(ValueError, match="loss_fn"):
        fit_distributed("mlp", distributed=Distributed(), device="cpu", loss_fn=lambda out: out)
    assert started == []


class DashboardDown(Exception):
    """A callback's own error."""


def test_a_callbacks_error_is_raised_as_itself_with_every_ranks_records() -> None:
    class FailAtTwo:
        def on_log(self, record: dict) -> None:
            if record["step"] >= 2:
                raise DashboardDown("dashboard down")

    with pytest.raises(DashboardDown, match="dashboard down") as info:
        _run(steps=100_000, callbacks=[FailAtTwo()])
    result = info.value.result  # every rank ended first, their records gathered
    assert isinstance(result, DistributedResult) and result.stopped
    assert [r.rank for r in result.ranks] == [0, 1] and len(result.ranks[0].records) >= 2
    assert not Path(result.run_dir).exists()
    assert _leftovers(result.run_dir) == []


def test_stop_ends_every_rank_between_steps_and_keeps_the_records() -> None:
    import threading

    stop = threading.Event()

    class StopAfterTwo:
        def on_log(self, record: dict) -> None:
            if record["step"] >= 2:
                stop.set()

    result = _run(steps=100_000, callbacks=[StopAfterTwo()], stop=stop)
    assert result.stopped and result.error is None
    assert all(len(r.records) >= 2 for r in result.ranks)
    assert len(result.records) >= 2
    assert _leftovers(result.run_dir) == []
