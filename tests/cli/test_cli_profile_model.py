"""`precision-nb profile --model/--batches`: every bad input exits 2 with a reason, nothing run."""

from __future__ import annotations

import itertools
import sys
import textwrap

import pytest

from precision_nb.cli.main import main

MODULE = textwrap.dedent(
    """
    import torch
    from torch import nn

    def make():
        return nn.Linear(4, 2)

    def not_a_model():
        return 42

    def broken():
        raise RuntimeError("no weights file")

    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))]

    def data_factory():
        return data

    strings = ["a", "b"]
    number = 3

    class ColumnMissing(Exception):
        pass

    class NeedsAColumn(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, x):
            raise ColumnMissing("column 'age' is missing")

    def needs_a_column():
        return NeedsAColumn()
    """
)


_COUNT = itertools.count()


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"usermodels_{next(_COUNT)}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("model", "batches", "message"),
    [
        ("nomodule_xyz:make", None, "--model: cannot import module 'nomodule_xyz'"),
        ("{m}", None, "--model: invalid value"),
        ("{m}:missing", None, "has no attribute 'missing'"),
        ("{m}:number", None, "--model: {m}:number is a int"),
        ("{m}:not_a_model", None, "returned int; allowed: a torch.nn.Module"),
        ("{m}:broken", None, "raised RuntimeError: no weights file"),
        ("{m}:make", None, "has no name `batches`"),
        ("{m}:make", "{m}:number", "batches has type int"),
        ("{m}:make", "{m}:strings", "batch 0 has type str"),
    ],
)
def test_bad_model_or_batches_exit_2(user_module, capsys, tmp_path, model, batches, message):
    m = user_module
    args = ["profile", "--no-progress", "--model", model.format(m=m), "--out", str(tmp_path / "o")]
    if batches:
        args += ["--batches", batches.format(m=m)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message.format(m=m) in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_batches_without_model_is_refused(capsys, tmp_path):
    assert main(["profile", "--batches", "x:y", "--out", str(tmp_path / "o")]) == 2
    assert "--batches: given without --model" in capsys.readouterr().err


def test_model_and_workload_together_are_refused(user_module, capsys, tmp_path):
    args = ["profile", "--model", f"{user_module}:make", "--workload", "cnn"]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_your_models_error_is_a_failed_run_naming_its_type_plan_and_line(
    user_module, capsys, tmp_path
):
    m = user_module
    args = ["profile", "--no-progress", "--model", f"{m}:needs_a_column", "--batches", f"{m}:data"]
    args += ["--compare", "fp32", "--processes", "1", "--out", str(tmp_path / "o")]
    assert main(args) == 1
    err = capsys.readouterr().err
    (line,) = [i for i, text in enumerate(MODULE.splitlines()) if "raise ColumnMissing" in text]
    assert (
        "precision-nb profile: run failed: plan fp32: ColumnMissing: column 'age' is missing "
        f"(raised at {tmp_path / m}.py:{line + 1} in forward)"
    ) in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_a_plan_failing_part_way_still_gets_a_report_and_exit_1(
    tmp_path, capsys, monkeypatch, make_result, make_comparison
):
    from precision_nb.engine.results import attach_result
    from precision_nb.views.report import profile as report

    comparison = make_comparison(
        fp32=make_result("fp32", "fp32"),
        failures={"bf16": "failed in round 3: RuntimeError: bf16 kernel failed"},
    )

    def partial(request, *args):
        raise attach_result(RuntimeError("bf16 kernel failed"), comparison, "plan bf16 failed; ")

    monkeypatch.setattr(report, "_compare", partial)
    out = tmp_path / "out"
    # The fake comparison has records only: no model to inspect or analyse.
    args = ["--preset", "tiny", "--no-inspect", "--no-numerics", "--out", str(out)]
    assert main(["profile", "--no-progress", *args]) == 1
    err = capsys.readouterr().err
    assert "plan bf16 failed in round 3" in err and "the report covers" in err
    assert (out / "report.html").exists() and (out / "summary.csv").exists()


def test_a_failure_without_any_completed_plan_is_raised(monkeypatch, tmp_path, capsys):
    from precision_nb.engine.compare import Comparison
    from precision_nb.engine.results import attach_result
    from precision_nb.views.report import profile as report

    def failing(request, *args):
        nothing = Comparison(failures={"fp32": "failed in round 1"})
        raise attach_result(OSError("shard gone"), nothing, "plan fp32 failed; ")

    monkeypatch.setattr(report, "_compare", failing)
    assert main(["profile", "--no-progress", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "run failed: plan fp32: OSError: shard gone (raised at " in err
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_a_model_from_an_import_path_is_measured_in_fresh_processes_too(user_module, tmp_path):
    import csv

    out = tmp_path / "out"
    args = [
        "--model", f"{user_module}:make", "--batches", f"{user_module}:data",
        "--compare", "fp32,bf16", "--steps", "4", "--rounds", "2", "--processes", "2",
        "--no-inspect", "--no-numerics", "--out", str(out),
    ]  # fmt: skip
    assert main(["profile", "--no-progress", *args]) == 0
    with (out / "summary.csv").open(newline="") as handle:
        by_run = {r["run"]: r for r in csv.DictReader(handle)}
    # a fresh process rebuilt the model from the factory (with this process's initial weights)
    assert by_run["bf16"]["processes"] == "2", by_run["bf16"]["stopped_by"]
    assert by_run["bf16"]["stopped_by"].startswith("2 processes, as asked")
