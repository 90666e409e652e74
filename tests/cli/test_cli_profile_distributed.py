"""`precision-nb profile --nproc 2`: the plans measured in one torchrun launch of 2 CPU processes
(gloo)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from precision_nb.cli.main import main
from precision_nb.core.distributed import Distributed
from precision_nb.views.report.profile import profile


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_ddp_profile_reports_per_rank_steps_memory_and_bf16_all_reduce(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        [
            "profile", "--no-progress", "--preset", "tiny", "--steps", "2", "--device", "cpu",
            "--compare", "bf16", "--nproc", "2", "--strategy", "ddp", "--comm-hook", "bf16",
            "--no-numerics", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    steps = _rows(out / "distributed_steps.csv")
    assert sorted(r["rank"] for r in steps) == ["0", "1"]
    assert all(float(r["median_step_time_s"]) > 0 and r["plan"] == "bf16" for r in steps)
    memory = _rows(out / "distributed_memory.csv")
    params = {
        r["rank"]: int(r["bytes"]) for r in memory if r["kind"] == "parameters"
    }  # DDP: full fp32 replicas
    assert params["0"] == params["1"] > 0
    comm = _rows(out / "distributed_comm.csv")
    reduce = {(r["rank"], r["dtype"]): float(r["bytes_per_step"]) for r in comm}
    # bf16 compression: every gradient all-reduced once per step in 2 bytes instead of 4.
    for rank in ("0", "1"):
        assert reduce[(rank, "bf16")] == params[rank] / 2
        assert (rank, "fp32") not in reduce
    summary = _rows(out / "summary.csv")
    assert [r["run"] for r in summary] == ["bf16"] and float(summary[0]["median_step_time_s"]) > 0
    # measured like one process: a warm-up apart (agreed by the ranks), then rounds (2 steps: 2)
    assert int(float(summary[0]["rounds"])) == 2 and int(float(summary[0]["warmup_steps"])) >= 1
    assert "agreed" in summary[0]["warmup_rule"]
    assert all(
        r["timing"] == "measured steps of the rounds" and r["steps_timed"] == "2" for r in steps
    )
    text = (out / "report.html").read_text(encoding="utf-8")
    assert "distributed step time" in text and "slowest rank" in text
    assert '<section id="distributed">' in text and "ddp x2 on cpu over gloo" in text
    assert '<section id="inspection"' not in text  # per-rank memory comes from the run


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--comm-hook", "bf16"], "--comm-hook: given without --nproc"),
        (["--nproc", "3"], "not divisible"),
        (["--nproc", "2", "--strategy", "fsdp2", "--comm-hook", "bf16"], "distributed.comm_hook"),
        (["--nproc", "0"], "--nproc"),
    ],
)
def test_bad_distributed_requests_exit_2_before_anything_starts(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    code = main(["profile", "--no-progress", "--preset", "tiny", "--out", str(out), *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_profile_of_a_model_object_refuses_distributed():
    with pytest.raises(ValueError, match="cannot run on torchrun workers"):
        profile(torch.nn.Linear(4, 2), [torch.zeros(2, 4)], distributed=Distributed("ddp", 2))
