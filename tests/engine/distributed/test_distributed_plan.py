"""The distributed request and its resolution, in one process (no ranks are started here)."""

from __future__ import annotations

import time

import pytest
import torch

from precision_nb.core.distributed import (
    CLUSTER_PRESETS,
    Distributed,
    expected_comm_bytes,
    explain_distributed,
    ring_seconds,
)
from precision_nb.engine.distributed.counting import CommCounter
from precision_nb.engine.distributed.parallel import check_divisible, rank_slice
from precision_nb.engine.distributed.results import RankResult, merge_records


def _decision(plan, name):
    return next(d for d in plan.decisions if d.field == name)


def test_fsdp2_dtypes_derive_from_the_plan_with_reasons() -> None:
    plan = explain_distributed(Distributed("fsdp2", 2), "bf16", "cpu")
    assert (plan.param_dtype, plan.reduce_dtype, plan.output_dtype) == ("bf16", "fp32", None)
    assert "reduce_dtype='bf16'" in _decision(plan, "reduce_dtype").reason
    fp32 = explain_distributed(Distributed("fsdp2", 2), "fp32", "cpu")
    assert fp32.param_dtype == "fp32"
    explicit = explain_distributed(Distributed("fsdp2", 2, reduce_dtype="bfloat16"), "bf16", "cpu")
    assert explicit.reduce_dtype == "bf16"
    assert "as requested" in _decision(explicit, "reduce_dtype").reason


def test_the_fp32_reduce_default_is_said_to_be_this_package_s_and_torch_s_is_said_too() -> None:
    from dataclasses import fields

    from torch.distributed.fsdp import MixedPrecisionPolicy

    # torch's own policy: reduce_dtype None, and then the reduction runs in param_dtype
    torch_default = {f.name: f.default for f in fields(MixedPrecisionPolicy)}["reduce_dtype"]
    assert torch_default is None
    reason = _decision(explain_distributed(Distributed("fsdp2", 2), "bf16", "cpu"), "reduce_dtype")
    assert reason.outcome == "fp32" and reason.reason.startswith("precision_nb's default")
    assert (
        "torch's own MixedPrecisionPolicy defaults to reduce_dtype=None, which reduces in the "
        "param_dtype (bf16)"
    ) in reason.reason


def test_an_fp32_all_reduce_is_not_called_exact() -> None:
    plan = explain_distributed(Distributed("ddp", 2), "fp32", "cpu")
    why = _decision(plan, "comm_hook").reason
    assert "exact" not in why and "rounded" in why and "order" in why


def test_backend_is_gloo_on_cpu_and_nccl_on_simulated_cuda() -> None:
    cpu = explain_distributed(Distributed("ddp", 2), None, "cpu")
    assert cpu.backend == "gloo" and cpu.rank_device == "cpu" and not cpu.simulated
    h100 = explain_distributed(Distributed("ddp", 8), None, "auto", hardware="8xH100 NVLink")
    assert h100.backend == "nccl" and h100.rank_device == "cuda:LOCAL_RANK"
    assert h100.simulated and "simulated" in str(h100)
    assert h100.precision.plan.mode == "bf16"


def test_requests_the_machine_cannot_run_fail_before_start() -> None:
    with pytest.raises(RuntimeError, match="nccl needs CUDA"):
        explain_distributed(Distributed("ddp", 2, backend="nccl"), None, "cpu")
    with pytest.raises(RuntimeError, match="has 1 CUDA device"):
        explain_distributed(Distributed("ddp", 2), None, "cuda", hardware="cuda-bf16")
    with pytest.raises(RuntimeError, match="has 8 CUDA"):
        explain_distributed(Distributed("ddp", 9), None, "cuda", hardware="8xH100 NVLink")
    with pytest.raises(RuntimeError, match="no torch.distributed backend"):
        explain_distributed(Distributed("ddp", 2), None, "mps", hardware="mps")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"strategy": "zero3"}, "distributed.strategy"),
        ({"nproc": 0}, "distributed.nproc"),
        ({"strategy": "ddp", "param_dtype": "bf16"}, "distributed.param_dtype"),
        ({"strategy": "fsdp2", "comm_hook": "bf16"}, "distributed.comm_hook"),
        ({"comm_hook": "int8"}, "distributed.comm_hook"),
        ({"backend": "mpi"}, "distributed.backend"),
        ({"rdzv_host": " "}, "distributed.rdzv_host"),
    ],
)
def test_bad_requests_name_the_field(kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        Distributed(**kwargs)


def test_expected_bytes_halve_with_compression_and_low_precision_params() -> None:
    n = 1000
    fp32 = explain_distributed(Distributed("ddp", 2), None, "cpu")
    bf16 = explain_distributed(Distributed("ddp", 2, comm_hook="bf16"), None, "cpu")
    assert expected_comm_bytes(fp32, n) == {"all_reduce": {"fp32": 4 * n}}
    assert expected_comm_bytes(bf16, n) == {"all_reduce": {"bf16": 2 * n}}
    fsdp = explain_distributed(Distributed("fsdp2", 4), "bf16", "cpu")
    assert expected_comm_bytes(fsdp, n) == {
        "all_gather": {"bf16": 2 * 2 * n},
        "reduce_scatter": {"fp32": 4 * n},
    }
    link = CLUSTER_PRESETS["8xH100 NVLink"].link_gb_per_s
    assert ring_seconds("all_reduce", 1e9, 8, link) == pytest.approx(2 * 7 / 8 / link)
    assert ring_seconds("all_gather", 1e9, 8, link) == pytest.approx(7 / 8 / link)


def test_rank_slices_cover_the_global_batch_and_refuse_remainders() -> None:
    x = torch.arange(12).view(6, 2)
    y = torch.arange(6)
    parts = [rank_slice((x, y), r, 3) for r in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert torch.equal(torch.cat([p[1] for p in parts]), y)
    assert rank_slice({"ids": y}, 1, 2)["ids"].tolist() == [3, 4, 5]
    with pytest.raises(ValueError, match="not divisible by distributed.nproc=4"):
        rank_slice(x, 0, 4)
    check_divisible(None, 3)  # unknown size: nothing to check


def test_comm_counter_adds_bytes_by_op_and_dtype_then_restarts() -> None:
    c = CommCounter()
    c.add("all_reduce", [torch.zeros(10), torch.zeros(6, dtype=torch.bfloat16)])
    c.add("all_reduce", [torch.zeros(10)])
    rows = {(r["op"], r["dtype"]): (r["bytes"], r["calls"]) for r in c.take()}
    assert rows == {("all_reduce", "fp32"): (80, 2), ("all_reduce", "bf16"): (12, 1)}
    assert c.take() == []


def test_merged_records_average_the_loss_and_take_the_slowest_rank() -> None:
    a = RankResult(0, records=[{"step": 1, "loss": 1.0, "step_time_s": 0.1, "samples_per_s": 40}])
    b = RankResult(1, records=[{"step": 1, "loss": 3.0, "step_time_s": 0.2, "samples_per_s": 20}])
    (rec,) = merge_records([a, b])
    assert rec["loss"] == 2.0 and rec["step_time_s"] == 0.2
    assert rec["samples_per_s"] == pytest.approx((4 + 4) / 0.2)
    assert merge_records([a, RankResult(1)]) == []  # a step not every rank logged


TORCHRUN_REPORT = """
Failures:
[1]:
  time      : 2026-11-30_11:10:45
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 11433)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_11:10:45
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 11434)
"""


def test_root_cause_prefers_a_killed_rank_then_the_earliest_error() -> None:
    from precision_nb.engine.distributed.failure import exit_codes, root_cause

    codes = exit_codes(TORCHRUN_REPORT)
    assert codes == {0: -15, 1: -9}
    done = RankResult(0, finished=True)
    killed = RankResult(1)  # no result, no error: it died without writing one
    assert root_cause([done, killed], codes) == 1
    late = RankResult(0, error={"t": 20.0}, finished=False)
    early = RankResult(1, error={"t": 10.0}, finished=False)
    assert root_cause([late, early], {}) == 1
    assert root_cause([RankResult(0, finished=True), RankResult(1, finished=True)], codes) == 0


def test_a_rank_the_agent_stopped_is_not_the_cause_beside_a_rank_that_raised() -> None:
    from precision_nb.engine.distributed.failure import root_cause

    raised = RankResult(1, error={"type": "ArithmeticError", "message": "boom", "t": 1.0})
    stopped = RankResult(0)  # no result, no error: the agent's SIGINT came before its handler
    assert root_cause([stopped, raised], {0: -2}) == 1
    assert root_cause([stopped, raised], {0: -15}) == 1
    assert root_cause([stopped, raised], {0: -9}) == 0  # killed outright (OOM killer): the cause
    assert root_cause([stopped, RankResult(1, finished=True)], {0: -2}) == 0


def test_fsdp2_shards_the_outermost_blocks_once() -> None:
    from torch import nn

    from precision_nb.engine.distributed.parallel import _shard_blocks
    from precision_nb.engine.workloads import get_workload

    model = get_workload("transformer", "tiny").make_model()
    sharded: list[nn.Module] = []
    _shard_blocks(model, sharded.append)
    assert sharded == list(model.blocks)  # not the MLPs inside each block again
    mlp = get_workload("mlp", "tiny").make_model()
    sharded = []
    _shard_blocks(mlp, sharded.append)
    assert sharded == [m for m in mlp.net if isinstance(m, nn.Linear)]


def test_a_rank_interrupted_by_a_requested_stop_is_stopped_not_failed() -> None:
    from precision_nb.engine.distributed.process import stopped_not_failed as _stopped_not_failed
    from precision_nb.engine.distributed.results import RankResult

    interrupted = RankResult(1, error={"type": "KeyboardInterrupt", "message": "signal SIGTERM"})
    interrupted.result = {"steps": 3}
    failed = RankResult(0, error={"type": "RuntimeError", "message": "boom"})
    _stopped_not_failed([interrupted, failed])
    assert interrupted.error is None and interrupted.finished and interrupted.stopped
    assert failed.error == {"type": "RuntimeError", "message": "boom"} and not failed.finished


def test_a_rank_whose_peer_stopped_first_is_stopped_not_failed() -> None:
    """The SIGTERM of a stop reaches the ranks one by one: a rank blocked in an all-reduce loses
    its peer's socket before it can take the signal (seen with gloo on a loaded machine)."""
    from precision_nb.engine.distributed.process import stopped_not_failed
    from precision_nb.engine.distributed.results import RankResult

    gone = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:35244: Connection reset by peer"

    def ranks(peer_error):
        waiting = RankResult(0, error={"type": "RuntimeError", "message": gone})
        waiting.result = {"steps": 28}
        peer = RankResult(1, error=peer_error)
        peer.result = {"steps": 28, "stopped": True} if peer_error is None else {"steps": 28}
        peer.finished = peer_error is None
        return waiting, peer

    waiting, peer = ranks(None)  # the peer stopped between steps, as the stop asked
    stopped_not_failed([waiting, peer])
    assert waiting.error is None and waiting.finished and waiting.stopped and peer.stopped
    waiting, peer = ranks({"type": "KeyboardInterrupt", "message": "signal SIGTERM"})
    stopped_not_failed([waiting, peer])
    assert waiting.stopped and peer.stopped
    waiting, peer = ranks({"type": "ValueError", "message": "bad batch"})  # a real failure
    stopped_not_failed([waiting, peer])
    assert waiting.error["message"] == gone and not waiting.finished
    assert peer.error == {"type": "ValueError", "message": "bad batch"}


class _Work:
    def __init__(self, future) -> None:
        self._future = future

    def get_future(self):
        if self._future is None:
            raise RuntimeError("this work has no future")
        return self._future


def test_comm_counter_times_a_call_until_its_work_completes_and_keeps_untimed_apart() -> None:
    c = CommCounter()
    future = torch.futures.Future()
    keys = c.add(
        "all_gather", [torch.zeros(4), torch.zeros(4), torch.zeros(2, dtype=torch.bfloat16)]
    )
    c.track(keys, _Work(future), time.perf_counter() - 0.5)  # called half a second ago
    untimed = c.add("reduce_scatter", [torch.zeros(3)])
    c.track(untimed, _Work(None), time.perf_counter())
    future.set_result(None)  # the work completes: the callback adds its seconds
    rows = {(r["op"], r["dtype"]): r for r in c.take()}
    fp32, bf16 = rows["all_gather", "fp32"], rows["all_gather", "bf16"]
    assert (fp32["calls"], fp32["timed_calls"], bf16["timed_calls"]) == (2, 2, 1)
    assert fp32["seconds"] == pytest.approx(2 * bf16["seconds"])  # split by tensor count
    assert fp32["seconds"] + bf16["seconds"] >= 0.5
    scatter = rows["reduce_scatter", "fp32"]
    assert (scatter["calls"], scatter["timed_calls"], scatter["seconds"]) == (1, 0, 0.0)


def test_comm_table_reports_seconds_in_flight_only_for_timed_calls() -> None:
    from precision_nb.engine.distributed.results import DistributedResult

    def row(op, step, steps, nbytes, calls, seconds, timed):
        return {"op": op, "dtype": "fp32", "step": step, "steps": steps,
                "bytes_per_step": nbytes / steps, "calls": calls, "seconds": seconds,
                "timed_calls": timed}  # fmt: skip

    rank = RankResult(0)
    rank.comm = [row("all_reduce", 2, 2, 80, 2, 0.4, 2), row("broadcast", 2, 2, 8, 2, 0.1, 2),
                 row("all_reduce", 5, 3, 120, 3, 0.2, 3),
                 row("reduce_scatter", 5, 3, 30, 3, 0.0, 0)]  # fmt: skip
    table = {r["op"]: r for r in DistributedResult(plan=None, ranks=[rank]).comm_table()}
    assert table["all_reduce"]["bytes_per_step"] == pytest.approx(40.0)
    assert table["all_reduce"]["in_flight_s_per_step"] == pytest.approx(0.6 / 5)
    assert table["all_reduce"]["timed_share"] == 1.0
    # an op issued in one interval only is averaged over all 5 logged steps, not its 2
    assert table["broadcast"]["bytes_per_step"] == pytest.approx(8 / 5)
    assert table["broadcast"]["calls_per_step"] == pytest.approx(2 / 5)
    assert table["reduce_scatter"]["bytes_per_step"] == pytest.approx(30 / 5)
    assert table["reduce_scatter"]["in_flight_s_per_step"] is None
    assert table["reduce_scatter"]["timed_share"] == 0.0


def test_rank0_optimizer_outcome_comes_back_from_the_rank_result() -> None:
    from precision_nb.core.optim import FusedOutcome
    from precision_nb.engine.distributed.results import DistributedResult, rank0_optimizer_outcome

    outcome = FusedOutcome(requested=None, probed=False, used=False, reason="probe false off CUDA")
    rank = RankResult(0)
    rank.result = {"optimizer_outcome": outcome.to_dict()}
    assert rank0_optimizer_outcome(DistributedResult(plan=None, ranks=[rank])) == outcome
    rank.result = {}  # a rank that left no outcome: None, not a guess
    assert rank0_optimizer_outcome(DistributedResult(plan=None, ranks=[rank])) is None


def test_a_signalled_node_is_named_though_another_node_ended_first(tmp_path) -> None:
    # Ctrl-C on node 1's agent: its rank stops between steps while node 0's rank loses its
    # connection and node 0's agent ends first; the launcher then stops node 1's agent too.
    from types import SimpleNamespace

    from precision_nb.engine.distributed.failure import AgentEnd, failure
    from precision_nb.engine.distributed.process import TorchrunRun
    from precision_nb.engine.distributed.results import DistributedResult

    lost = {"t": 5.0, "type": "RuntimeError", "message": "Connection closed by peer"}
    ranks = [RankResult(0, node=0, error=lost), RankResult(1, node=1, finished=True)]
    node0 = AgentEnd(0, 1, 5.1, False, "torch.distributed.elastic ChildFailedError\n")
    node1 = AgentEnd(1, 1, 6.0, True, "SignalException: Process 42 got signal: 2\n")
    run = TorchrunRun(1, "", False, 0.0, 6.0, tmp_path, [node0, node1], "127.0.0.1:1")
    plan = SimpleNamespace(request=SimpleNamespace(nnodes=2))
    error = failure(DistributedResult(plan=plan, ranks=ranks), run)
    assert error.node == 1
    assert "node 1: its torchrun agent received SIGINT (Ctrl-C)" in str(error)
    # the launcher's SIGTERM ended it while it waited for its rank: the Ctrl-C is still the cause
    node1 = AgentEnd(1, -15, 6.0, True, "SignalException: Process 42 got signal: 2\n")
    run = TorchrunRun(1, "", False, 0.0, 6.0, tmp_path, [node0, node1], "127.0.0.1:1")
    error = failure(DistributedResult(plan=plan, ranks=ranks), run)
    assert error.node == 1 and "received SIGINT (Ctrl-C)" in str(error)
    # a node the launcher stopped with its own SIGTERM is not the cause
    node1 = AgentEnd(1, 1, 6.0, True, "SignalException: Process 42 got signal: 15\n")
    run = TorchrunRun(1, "", False, 0.0, 6.0, tmp_path, [node0, node1], "127.0.0.1:1")
    error = failure(DistributedResult(plan=plan, ranks=ranks), run)
    assert error.node == 0 and "node 0, rank 0 raised RuntimeError" in str(error)
