"""Several nodes on this one machine: two torchrun agents of one process each (``--nnodes 2
--node-rank 0/1``, a c10d rendezvous on loopback, gloo) through the launcher the product uses.

The successful runs are shared (``one_node`` and ``two_nodes`` in this folder's conftest.py: the
same 2 ranks, as one node of two processes and as two nodes); every other test here starts one
launch of its own (a failure, an interrupt, a rendezvous that never completes, agents started by
hand with mismatched sizes) and checks that nothing is left running afterwards.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from dist_runs import STEPS, leftovers

from precision_nb.cli.main import main as cli
from precision_nb.core.distributed import Distributed, explain_distributed
from precision_nb.engine.distributed import DistributedError, fit_distributed
from precision_nb.engine.distributed.gather import gather
from precision_nb.engine.distributed.launcher import write_spec
from precision_nb.engine.distributed.nodes import world_problems
from precision_nb.engine.distributed.process import _environment, free_port

ROOT = Path(__file__).resolve().parents[3]


def _losses(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records]


def _no_leftovers(marker: str, within_s: float = 10.0) -> None:
    deadline = time.time() + within_s
    while leftovers(marker) and time.time() < deadline:
        time.sleep(0.2)
    assert leftovers(marker) == [], [p.info["cmdline"] for p in leftovers(marker)]


# --------------------------------------------------------------------- the successful run


def test_two_nodes_train_what_one_node_of_two_processes_trains(one_node, two_nodes) -> None:
    one, two = one_node.result, two_nodes.result
    assert len(two.records) == STEPS
    assert _losses(two.records) == pytest.approx(_losses(one.records), rel=1e-5)
    for rank in (0, 1):  # global rank r trains slice r of every batch, on either layout
        mine = _losses(two.ranks[rank].records)
        assert mine == pytest.approx(_losses(one.ranks[rank].records), rel=1e-5)
    assert two.plan.nnodes == 2 and two.plan.world_size == 2
    assert "2 nodes x1" in two.plan.summary()


def test_records_are_merged_per_rank_and_per_node(two_nodes) -> None:
    result = two_nodes.result
    assert sorted(r.node for r in result.ranks) == [0, 1]  # one rank on each node
    assert result.missing_ranks == []
    table = {row["node"]: row for row in result.node_table()}
    assert set(table) == {0, 1}
    for node, row in table.items():
        (rank,) = [r for r in result.ranks if r.node == node]
        assert row["ranks"] == [rank.rank] and row["steps_logged"] == STEPS
        assert _losses(result.node_records(node)) == _losses(rank.records)
        assert row["ready_s"] is not None and 0 <= row["ready_s"] <= result.seconds
    per_node = [_losses(result.node_records(n)) for n in (0, 1)]
    merged = [(a + b) / 2 for a, b in zip(*per_node, strict=True)]
    assert _losses(result.records) == pytest.approx(merged)
    assert all(r["nproc"] == 2 for r in result.records)
    assert two_nodes.collector.logged == result.ranks[0].records  # callbacks follow rank 0


def _comm(result) -> dict:
    return {
        (r["rank"], r["op"], r["dtype"]): (r["bytes_per_step"], r["calls_per_step"])
        for r in result.comm_table()
    }


def test_communication_bytes_by_dtype_equal_the_one_node_run(one_node, two_nodes) -> None:
    one, two = _comm(one_node.result), _comm(two_nodes.result)
    assert any(op == "all_reduce" for _, op, _ in two)
    assert two == one
    assert all("node" in row for row in two_nodes.result.comm_table())
    assert all("node" not in row for row in one_node.result.comm_table())  # one node: no column
    memory = {
        (m["rank"], m["kind"], m["dtype"]): m["bytes"] for m in one_node.result.memory_table()
    }
    assert {
        (m["rank"], m["kind"], m["dtype"]): m["bytes"] for m in two_nodes.result.memory_table()
    } == memory


def test_start_up_is_recorded_and_nothing_is_left_running(two_nodes) -> None:
    result = two_nodes.result
    assert 0 < result.startup_s < result.seconds  # measured; its size is the benchmark's job
    folder = two_nodes.run_dir
    assert {p.name for p in folder.glob("torchrun-node*.log")} == {
        "torchrun-node0.log",
        "torchrun-node1.log",
    }
    assert {p.name for p in folder.glob("node*.json")} == {"node0.json", "node1.json"}
    _no_leftovers(str(folder))


# --------------------------------------------------------------------- a real cluster's path


def test_gather_reads_the_folder_back_into_the_same_result(two_nodes) -> None:
    launched, gathered = two_nodes.result, gather(two_nodes.run_dir)
    assert gathered.records == launched.records
    assert _comm(gathered) == _comm(launched)
    assert [(r.rank, r.node, r.host) for r in gathered.ranks] == [
        (r.rank, r.node, r.host) for r in launched.ranks
    ]
    assert gathered.plan.summary() == launched.plan.summary()
    assert 0 < gathered.startup_s < gathered.seconds


def test_gather_writes_the_report_a_one_node_run_gets(one_node, two_nodes, tmp_path, capsys):
    outs = {}
    for name, run in (("one", one_node), ("two", two_nodes)):
        outs[name] = tmp_path / name
        assert cli(["gather", str(run.run_dir), "--out", str(outs[name])]) == 0
    printed = capsys.readouterr().out
    assert "node 0 (" in printed and "node 1 (" in printed
    files = {k: {p.name for p in v.iterdir()} for k, v in outs.items()}
    assert {"report.html", "metrics.csv", "summary.csv", "distributed_comm.csv"} <= files["one"]
    assert files["two"] == files["one"] | {"distributed_nodes.csv"}
    one, two = (pd.read_csv(outs[k] / "metrics.csv") for k in ("one", "two"))
    assert two["loss"].tolist() == pytest.approx(one["loss"].tolist(), rel=1e-5)
    nodes = pd.read_csv(outs["two"] / "distributed_nodes.csv")
    assert nodes["node"].tolist() == [0, 1]
    html = (outs["two"] / "report.html").read_text(encoding="utf-8")
    assert "Distributed: per rank" in html and "not an interleaved measurement" in html
    assert cli(["gather", str(tmp_path / "nothing-here")]) == 2
    assert "no spec.json there" in capsys.readouterr().err


def test_gather_names_what_is_missing_or_unfinished_in_a_folder(two_nodes, tmp_path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(two_nodes.run_dir, copy)
    lines = (copy / "rank1.jsonl").read_text(encoding="utf-8").splitlines()
    (copy / "rank1.jsonl").write_text("\n".join(lines[:3]) + "\n", encoding="utf-8")
    with pytest.raises(DistributedError, match=r"has not finished: rank 1 \(node \d\)") as info:
        gather(copy)
    assert len(info.value.result.ranks[0].records) == STEPS  # what was found is kept
    (copy / "rank1.jsonl").unlink()
    (copy / "node1.json").unlink()
    with pytest.raises(DistributedError, match="rank.s. 1 of 2 left no log") as info:
        gather(copy)
    assert "no agent of node(s) 1 started on this folder" in str(info.value)
    with pytest.raises(ValueError, match="holds the rank logs of an earlier run"):
        write_spec("mlp", distributed=Distributed("ddp", 1, nnodes=2), device="cpu", run_dir=copy)


def _normalized(command: str, port: str) -> list[str]:
    argv = shlex.split(command)
    argv = [a for a in argv if "=" not in a or a.startswith("-")]  # drop VAR=value prefixes
    argv[0] = "python"
    return [a.replace(f":{port}", ":PORT").replace(":29400", ":PORT") for a in argv]


def test_nodes_prints_the_commands_the_launcher_ran(two_nodes, capsys) -> None:
    assert cli(["nodes", str(two_nodes.run_dir)]) == 0
    out = capsys.readouterr().out
    printed = [ln for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert len(printed) == 2 and "loopback" in out
    assert all(ln.startswith("GLOO_SOCKET_IFNAME=lo") for ln in printed)
    ran = sorted(c for c in two_nodes.probe.cmdlines if "distributed.torchrun" in c)
    port = ran[0].split("--rdzv-endpoint=127.0.0.1:")[1].split()[0]
    assert [_normalized(c, port) for c in printed] == [_normalized(c, port) for c in ran]
    assert cli(["nodes", str(two_nodes.run_dir), "--srun"]) == 0
    srun = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("srun")]
    assert len(srun) == 1 and srun[0].startswith("srun --nodes=2 --ntasks-per-node=1 bash -c ")
    inner = shlex.split(srun[0])[-1].replace("python -m", "echo -m", 1)
    echoed = subprocess.run(
        ["bash", "-c", inner], env={**os.environ, "SLURM_NODEID": "1"}, capture_output=True,
        text=True, check=True,
    ).stdout  # fmt: skip
    assert "--node-rank=1 " in echoed and "is_host=0 " in echoed


# --------------------------------------------------------------------- failures and Ctrl-C


class OnStep:
    """At rank 0's third record: send ``signum`` to node 1's torchrun agent, or to this
    process (the launcher) when ``to_launcher``.

    The third, so that every rank has written two records by then whatever the machine's load:
    rank 0's step 3 needs every rank's step-3 gradients, and a rank writes its step-2 record
    before it starts step 3 (rank 0's second record alone says nothing of rank 1's)."""

    def __init__(self, signum: int, to_launcher: bool = False) -> None:
        self.signum, self.to_launcher, self.sent = signum, to_launcher, False

    def on_log(self, record: dict) -> None:
        if record["step"] < 3 or self.sent:
            return
        self.sent = True
        if self.to_launcher:
            os.kill(os.getpid(), self.signum)
            return
        for child in psutil.Process().children():
            if "--node-rank=1" in " ".join(child.cmdline()):
                os.kill(child.pid, self.signum)


def _two_nodes(run_dir: Path, **kw):
    model = kw.pop("model", "mlp")
    return fit_distributed(
        model,
        kw.pop("batches", None),
        distributed=Distributed("ddp", 1, nnodes=2, timeout_s=180),
        device="cpu",
        steps=kw.pop("steps", 100_000),  # ended by the failure or the signal
        log_every=1,
        measure_peak=False,
        run_dir=run_dir,
        **kw,
    )


def test_a_node_that_dies_ends_the_run_named_with_nothing_left(tmp_path) -> None:
    with pytest.raises(DistributedError, match="node 1: its torchrun agent was killed by signal "):
        _two_nodes(tmp_path, callbacks=[OnStep(signal.SIGKILL)])
    _no_leftovers(str(tmp_path))  # node 1's orphaned rank was killed by its recorded id


def test_ctrl_c_on_one_node_ends_the_run_named_with_nothing_left(tmp_path) -> None:
    with pytest.raises(DistributedError, match=r"node 1: .*received SIGINT \(Ctrl-C\)") as info:
        _two_nodes(tmp_path, callbacks=[OnStep(signal.SIGINT)])
    assert info.value.node == 1
    assert all(len(r.records) >= 2 for r in info.value.result.ranks)  # both nodes' records
    _no_leftovers(str(tmp_path))


def test_ctrl_c_in_the_launcher_stops_every_node_and_keeps_the_records(tmp_path) -> None:
    result = _two_nodes(tmp_path, callbacks=[OnStep(signal.SIGINT, to_launcher=True)])
    assert result.stopped and result.error is None
    assert sorted(r.node for r in result.ranks) == [0, 1]
    assert all(len(r.records) >= 2 for r in result.ranks)
    _no_leftovers(str(tmp_path))


def test_a_rank_failing_on_one_node_is_named_with_its_node(tmp_path) -> None:
    with pytest.raises(DistributedError, match=r"node 1, rank \d raised ArithmeticError") as info:
        _two_nodes(
            tmp_path, model="dist_helpers:raise_on_node1", batches="dist_helpers:batches", steps=8
        )
    assert info.value.node == 1
    assert "dist_helpers.py" in str(info.value)  # not node 0's lost connection
    _no_leftovers(str(tmp_path))


# --------------------------------------------------------------------- bad input


def test_a_rendezvous_that_never_completes_names_the_missing_node(tmp_path) -> None:
    port = free_port("127.0.0.1")
    request = Distributed("ddp", 1, nnodes=2, node_rank=0, rdzv_port=port, rdzv_timeout_s=5)
    with pytest.raises(DistributedError, match="node 1 never joined") as info:
        fit_distributed("mlp", distributed=request, device="cpu", steps=2, run_dir=tmp_path)
    message = str(info.value)
    assert f"127.0.0.1:{port} did not complete within 5 s" in message
    assert "started: node 0" in message and info.value.node == 1
    _no_leftovers(str(tmp_path))


def test_mismatched_world_sizes_between_agents_are_named(tmp_path, capsys) -> None:
    request = Distributed("ddp", 1, nnodes=2, rdzv_port=free_port("127.0.0.1"))
    write_spec("mlp", distributed=request, device="cpu", steps=2, run_dir=tmp_path)
    assert cli(["nodes", str(tmp_path), "--python", sys.executable]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("#")]
    lines[1] = lines[1].replace("--nproc-per-node=1", "--nproc-per-node=2")  # node 1 differs
    env = _environment("127.0.0.1")
    agents = [
        subprocess.Popen(
            ["bash", "-c", line],
            env=env,
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for line in lines
    ]
    try:
        codes = [a.wait(timeout=240) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
    assert all(code != 0 for code in codes)  # every rank refused the run
    with pytest.raises(DistributedError) as info:
        gather(tmp_path)
    message = str(info.value)
    assert "torchrun formed 3 ranks; the run file expects 2 node(s) x 1 process(es) = 2" in message
    assert "node 1 (" in message and "started 2 process(es)" in message
    _no_leftovers(str(tmp_path))


def test_a_node_rank_out_of_range_is_refused_before_anything_starts(monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"distributed.node_rank: invalid value 2 with nnodes=2"):
        Distributed("ddp", 1, nnodes=2, node_rank=2)
    with pytest.raises(ValueError, match="distributed.node_rank: invalid value -1"):
        Distributed("ddp", 1, nnodes=2, node_rank=-1)
    from torch.distributed import run

    from precision_nb.engine.distributed import torchrun

    started = []
    monkeypatch.setattr(run, "run", lambda args: started.append(args))
    argv = ["--nnodes=2", "--node-rank=2", "--nproc-per-node=1", "-m", "x"]
    with pytest.raises(torchrun.NodeRankError) as info:
        torchrun.main(argv)
    assert info.value.code == 2 and started == []
    assert info.value.message.endswith(
        "--node-rank: invalid value 2 with --nnodes=2; allowed: 0 to 1"
    )


def test_ranks_name_every_way_the_nodes_differ_from_the_run_file() -> None:
    layout = {"nnodes": 2, "nproc_per_node": 1}

    def ident(group, node, local_world=1, nnodes=2, host="a"):
        return {"group_rank": group, "node": node, "local_world_size": local_world,
                "agent_nnodes": nnodes, "host": host}  # fmt: skip

    assert world_problems(layout, 2, [ident(0, 0), ident(1, 1, host="b")]) == []
    same = world_problems(layout, 2, [ident(0, 0), ident(1, 0, host="b")])
    assert any("node rank 0 was given to 2 agents" in p for p in same)
    wide = world_problems(layout, 2, [ident(0, 0), ident(1, 1, nnodes=3)])
    assert wide == ["node 1 (a) was started with --nnodes=3; the run file says 2"]
    out = world_problems(layout, 2, [ident(0, 0), ident(1, 5)])
    assert any("node rank 5, out of range for 2 node(s)" in p for p in out)
    alone = world_problems(layout, 1, [ident(0, 0)])
    assert "1 node(s) joined; the run file expects 2" in alone


def test_bad_multinode_requests_are_refused_before_any_process_starts(monkeypatch) -> None:
    from precision_nb.engine.distributed import process

    started = []
    monkeypatch.setattr(process.subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(ValueError, match="distributed.rdzv_port: invalid value None"):
        Distributed("ddp", 1, nnodes=2, node_rank=1)
    with pytest.raises(ValueError, match="distributed.nnodes"):
        Distributed("ddp", 1, nnodes=0)
    with pytest.raises(ValueError, match="distributed.rdzv_timeout_s"):
        Distributed("ddp", 1, nnodes=2, rdzv_timeout_s=0)
    with pytest.raises(ValueError, match=r"not divisible by distributed.nnodes x nproc = 2 x 3"):
        fit_distributed("mlp", distributed=Distributed("ddp", 3, nnodes=2), device="cpu")
    assert started == []
    plan = explain_distributed(Distributed("ddp", 1, nnodes=2, rdzv_timeout_s=30), None, "cpu")
    reasons = {d.field: d.reason for d in plan.decisions}
    assert "every node runs on this machine" in reasons["nnodes"]
    assert "waiting up to 30 s for all 2 nodes" in reasons["rendezvous"]
    node1 = explain_distributed(Distributed("ddp", 1, nnodes=2, node_rank=1, rdzv_port=29500))
    assert "this machine is node 1" in {d.field: d.reason for d in node1.decisions}["nnodes"]
