"""``precision-nb inspect``: a workload or a user model, CSVs + figures + HTML, clear errors."""

from __future__ import annotations

import sys
import textwrap

import pandas as pd
import pytest

from precision_nb.cli.main import main


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "usermodel.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def make():
                return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3))

            def batches():
                g = torch.Generator().manual_seed(0)
                x = torch.randn(4, 8, generator=g)
                return [(x, torch.randint(0, 3, (4,), generator=g))]

            class ColumnMissing(Exception):
                pass

            class NeedsAColumn(nn.Linear):
                def forward(self, x):
                    raise ColumnMissing("column 'age' is missing")

            def needs_a_column():
                return NeedsAColumn(8, 3)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "usermodel"
    sys.modules.pop("usermodel", None)


def test_your_models_own_error_is_one_line_with_its_type_and_line(user_module, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["inspect", "--model", f"{user_module}:needs_a_column", "--batches"]
    assert main([*argv, f"{user_module}:batches", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    source = (tmp_path / "usermodel.py").read_text().splitlines()
    (line,) = [i + 1 for i, text in enumerate(source) if "raise ColumnMissing" in text]
    assert err == (
        "precision-nb inspect: run failed: ColumnMissing: column 'age' is missing "
        f"(raised at {tmp_path / 'usermodel.py'}:{line} in forward)\n"
    )
    assert not out.exists()


def test_inspect_a_user_model_writes_the_report(user_module, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["inspect", "--model", f"{user_module}:make", "--batches", f"{user_module}:batches"]
    rc = main([*argv, "--precision", "fp32,bf16,fp16", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "fp16: same plan as an earlier request" in printed  # CPU fp16 resolves to fp32
    memory = pd.read_csv(out / "inspection_memory.csv")
    assert set(memory["plan"]) == {"fp32", "bf16"}
    params = memory[(memory["kind"] == "parameters") & (memory["plan"] == "bf16")]
    assert params["bytes"].tolist() == [4 * (8 * 16 + 16 + 16 * 3 + 3)]
    ops = pd.read_csv(out / "inspection_ops.csv")
    assert (ops[(ops["plan"] == "bf16") & (ops["op"] == "addmm")]["output"] == "bf16").all()
    page = (out / "inspection.html").read_text()
    assert page.count("<img") == 3 and "Memory by kind and dtype" in page


def test_inspect_a_simulated_device_writes_the_documented_policy(tmp_path):
    out = tmp_path / "sim"
    rc = main(
        [
            "inspect",
            "--workload",
            "mlp",
            "--preset",
            "tiny",
            "--simulate",
            "cuda-bf16",
            "--precision",
            "auto",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    policy = pd.read_csv(out / "inspection_policy.csv")
    assert "layer_norm" in set(policy["op"]) and policy["source"].str.contains("not a trace").all()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "nomodule_xyz:make", "--batches", "x:y"], "--model: cannot import"),
        (["--model", "json:loads"], "--model: json:loads() raised TypeError"),
        (["--workload", "mlp", "--batches", "json:loads"], "--batches: given without --model"),
        (["--workload", "nope"], "--workload: invalid value 'nope'"),
        (["--preset", "huge"], "--preset: invalid value 'huge'"),
        (["--device", "gpu"], "for a GPU: 'cuda', 'cuda:N' or 'mps'"),
        (["--precision", "fp8"], "fp8"),
    ],
)
def test_bad_input_exits_2_with_the_field(argv, message, tmp_path, capsys):
    assert main(["inspect", *argv, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_out_that_is_an_existing_file_exits_2_naming_it(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("keep")
    assert main(["inspect", "--workload", "mlp", "--preset", "tiny", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert f"--out: {str(target)!r} exists and is not a folder" in err
    assert target.read_text() == "keep"


def test_a_full_disk_leaves_out_as_it_was_and_says_what_and_how_much(tmp_path, capsys, full_disk):
    out = tmp_path / "out"
    out.mkdir()
    (out / "inspection.html").write_text("previous page")
    full_disk(".png")
    argv = ["inspect", "--workload", "mlp", "--preset", "tiny", "--precision", "fp32"]
    assert main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert "could not write" in err and ".png" in err and "No space left on device" in err
    assert "MiB free" in err and "left as it was" in err
    assert [p.name for p in out.iterdir()] == ["inspection.html"]  # nothing half-written
    assert (out / "inspection.html").read_text() == "previous page"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
