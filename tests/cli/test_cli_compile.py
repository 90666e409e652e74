"""The command line's compile flags: `plan --compile MODE` (no model is compiled here)."""

from __future__ import annotations

import json

from precision_nb.cli.main import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_explains_the_compile_mode_as_the_last_decision(capsys):
    code, out, err = _run(capsys, "plan", "--device", "cpu", "--mode", "bf16", "--compile",
                          "Reduce-Overhead")  # fmt: skip
    assert code == 0 and not err
    assert "compile: reduce-overhead" in out.splitlines()[0]
    last = [line for line in out.splitlines() if line.strip().startswith("7. compile")]
    assert last and "(fallback)" in last[0] and "CUDA graphs skipped" in last[0]


def test_plan_json_carries_the_compile_plan(capsys):
    code, out, _ = _run(capsys, "plan", "--json", "--simulate", "cuda-bf16", "--compile",
                        "max-autotune")  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["compile"]["mode"] == "max-autotune"
    assert data["compile"]["simulated"] is True
    assert data["decisions"][-1]["field"] == "compile"


def test_plan_without_compile_flag_stays_eager(capsys):
    code, out, _ = _run(capsys, "plan", "--json", "--device", "cpu")
    data = json.loads(out)
    assert data["compile"]["mode"] == "off"
    assert all(d["field"] != "compile" for d in data["decisions"])


def test_a_bad_compile_mode_is_one_line_naming_flag_value_and_allowed(capsys):
    code, out, err = _run(capsys, "plan", "--compile", "fast")
    assert code == 2 and not out
    assert err.strip() == (
        "precision-nb plan: error: --compile: invalid value 'fast' (str); allowed: 'off', "
        "'default', 'reduce-overhead', 'max-autotune'"
    )


def test_a_mode_this_machine_cannot_compile_is_refused_with_exit_2(capsys):
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"cpp.cxx": (None, "no-such-cxx-precision-nb")}):
        code, out, err = _run(capsys, "plan", "--device", "cpu", "--compile", "default")
    assert code == 2 and not out
    assert "no C++ compiler was found" in err and "no-such-cxx-precision-nb" in err


# --------------------------------------------------------------------------- the plan as code


def test_every_framework_script_carries_the_compile_mode():
    import ast

    import precision_nb as pnb

    e = pnb.plan("bf16", "cpu", compile="reduce-overhead")
    expected = {
        "pytorch": 'model = torch.compile(model, mode="reduce-overhead")',
        "lightning": 'torch.compile(LitModel(), mode="reduce-overhead")',
        "accelerate": 'dynamo_plugin=TorchDynamoPlugin(backend="inductor", mode="reduce-overhead")',
        "transformers": 'torch_compile_mode="reduce-overhead"',
    }
    for framework, line in expected.items():
        code = e.code(framework)
        ast.parse(code)
        assert line in code, framework
    default = pnb.plan("bf16", "cpu", compile="default").code("pytorch")
    assert "model = torch.compile(model)\n" in default
    assert "torch.compile" not in pnb.plan("bf16", "cpu").code("pytorch")


def test_the_framework_compile_settings_exist_in_the_installed_frameworks():
    """The names the scripts write are the frameworks' own (built here, nothing trains)."""
    from accelerate.utils import TorchDynamoPlugin
    from transformers import TrainingArguments

    plugin = TorchDynamoPlugin(backend="inductor", mode="reduce-overhead")
    assert plugin.mode == "reduce-overhead"
    args = TrainingArguments(
        output_dir="unused", torch_compile=True, torch_compile_backend="inductor",
        torch_compile_mode="reduce-overhead", use_cpu=True, report_to="none",
    )  # fmt: skip
    assert args.torch_compile and args.torch_compile_mode == "reduce-overhead"


# --------------------------------------------------------------------------- profile --compile


def test_profile_refuses_a_bad_compile_list_before_torch_loads(capsys, tmp_path):
    code, out, err = _run(capsys, "profile", "--compile", "off,fast", "--out", str(tmp_path / "o"))
    assert code == 2 and not out
    assert "--compile: invalid value 'fast'" in err
    code, _, err = _run(capsys, "profile", "--compile", "default,default", "--out",
                        str(tmp_path / "o"))  # fmt: skip
    assert code == 2 and "default given twice" in err
    assert not (tmp_path / "o").exists()


def test_profile_refuses_compile_with_a_distributed_profile(capsys, tmp_path):
    code, _, err = _run(capsys, "profile", "--compile", "default", "--nproc", "2", "--out",
                        str(tmp_path / "o"))  # fmt: skip
    assert code == 2 and "distributed runs train eagerly" in err


def test_profile_measures_each_request_eager_and_compiled(capsys, tmp_path):
    """One small profile of the cross product (mlp/tiny, fp32 x off,default, one process)."""
    import csv

    out_dir = tmp_path / "out"
    code, out, err = _run(
        capsys, "profile", "--workload", "mlp", "--preset", "tiny", "--compare", "fp32",
        "--compile", "off,default", "--steps", "12", "--rounds", "6", "--processes", "1",
        "--no-inspect", "--no-numerics", "--no-progress", "--out", str(out_dir),
    )  # fmt: skip
    assert code == 0, err
    assert "fp32+compile" in out
    rows = list(csv.DictReader((out_dir / "compile.csv").open()))
    assert [r["plan"] for r in rows] == ["fp32+compile"] and rows[0]["eager_plan"] == "fp32"
    assert float(rows[0]["compile_s"]) > 0
    assert rows[0]["compile_cache"] in ("hit", "miss", "partial")
    html = (out_dir / "report.html").read_text()
    assert "torch.compile: what compiling cost and changed" in html
    summary = list(csv.DictReader((out_dir / "summary.csv").open()))
    assert {r["run"] for r in summary} == {"fp32", "fp32+compile"}


def test_profile_compile_argument_spellings():
    import pytest

    from precision_nb.engine.request import RunRequest

    def compiles(value):
        return RunRequest.of("mlp", compile=value).compiles

    assert compiles("off, default") == ("off", "default")
    assert compiles(["OFF", True]) == ("off", "default")
    assert compiles(None) == ("off",) and compiles("max-autotune") == ("max-autotune",)
    with pytest.raises(ValueError, match="compile: invalid value 'fast'"):
        compiles(["off", "fast"])
