"""`precision-nb plan`: text and JSON output, presets, config files, flags over config, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from precision_nb.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_output_for_a_simulated_gpu(capsys):
    code, out, err = _run(capsys, "--simulate", "cuda-no-bf16")
    assert code == 0 and not err
    assert "Precision plan: fp16 on cuda" in out
    assert "cuda-auto-no-bf16" in out and "GradScaler('cuda')" in out


def test_json_output(capsys):
    code, out, _ = _run(capsys, "--json", "--simulate", "cuda-bf16", "--mode", "fp16")
    data = json.loads(out)
    assert code == 0
    assert data["plan"]["mode"] == "fp16" and data["plan"]["use_scaler"] is True
    assert data["capabilities"]["name"] == "cuda-bf16"


def test_dtype_and_fused_flags(capsys):
    code, out, _ = _run(capsys, "--json", "--device", "cpu", "--dtype", "bf16", "--fused", "TRUE")
    data = json.loads(out)
    assert data["plan"]["mode"] == "bf16"  # mode defaults to auto, so dtype counts
    assert data["optimizer"]["fused"] is True
    fused = [d for d in data["decisions"] if d["field"] == "fused AdamW"][0]
    assert fused["outcome"] == "fused AdamW"


def test_loss_scale_lab_flag(capsys):
    code, out, _ = _run(capsys, "--json", "--device", "cpu", "--mode", "fp16", "--loss-scale-lab")
    plan = json.loads(out)["plan"]
    assert (plan["mode"], plan["use_scaler"], plan["autocast_enabled"]) == ("fp16", True, True)


def test_flags_override_config_values(capsys, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("device: cpu\nprecision:\n  mode: bf16\noptimizer:\n  fused: true\n")
    code, out, _ = _run(capsys, "--json", "--config", str(path))
    data = json.loads(out)
    assert data["plan"]["mode"] == "bf16" and data["optimizer"]["fused"] is True
    code, out, _ = _run(
        capsys, "--json", "--config", str(path), "--mode", "fp32", "--fused", "false"
    )
    data = json.loads(out)
    assert data["plan"]["mode"] == "fp32" and data["optimizer"]["fused"] is False
    assert data["device"] == "cpu"  # kept from the file


def test_verify_runs_on_this_machine(capsys):
    code, out, _ = _run(capsys, "--device", "cpu", "--mode", "bf16", "--verify")
    assert code == 0 and "Autocast check: ok" in out and "torch.bfloat16" in out


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--mode", "fp8"], ["--mode", "'fp8'", "'bf16'"]),
        (["--mode", "half precision"], ["--mode", "'half precision'"]),
        (["--dtype", "16"], ["--dtype", "'16'"]),
        (["--device", "gpu"], ["--device", "'gpu'", "'cuda:N'", "another torch device string"]),
        (["--device", "cuda:7", "--simulate", "cuda-bf16"], ["'cuda:7'", "1 CUDA device"]),
        (["--device", "mps", "--simulate", "cpu-only"], ["MPS is not available"]),
        (["--simulate", "a100"], ["--simulate", "'a100'", "'cuda-bf16'"]),
        (["--config", "missing-file.yaml"], ["missing-file.yaml", "not found"]),
        (["--verify", "--simulate", "cuda-bf16"], ["--verify", "real hardware"]),
    ],
)
def test_bad_input_exits_2_with_a_message_and_no_traceback(capsys, argv, words):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("precision-nb plan: error:")
    assert "Traceback" not in err
    for word in words:
        assert word in err


def test_bad_config_key_exits_2(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text('optimizer:\n  fused: "yes"\n')
    code, _, err = _run(capsys, "--config", str(path))
    assert code == 2 and "optimizer.fused" in err and "'yes'" in err


def test_bad_fused_flag_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--fused", "yes"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--fused" in err and "'yes'" in err and "Traceback" not in err


def test_module_entry_point_prints_json():
    proc = subprocess.run(
        [sys.executable, "-m", "precision_nb.cli.main", "plan", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["simulated"] is False
    assert [d["field"] for d in data["decisions"]][:2] == ["device", "mode"]


def test_alias_bomb_config_is_refused_quickly(capsys, tmp_path):
    import time

    names = "abcdefghi"
    levels = "".join(f"    - &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in pairwise(names))
    path = tmp_path / "bomb.yaml"
    path.write_text("precision:\n  mode:\n    - &a [" + ", ".join(["lol"] * 9) + "]\n" + levels)
    start = time.perf_counter()
    code, out, err = _run(capsys, "--config", str(path))
    assert time.perf_counter() - start < 5
    assert code == 2 and out == "" and "Traceback" not in err
    assert "expands to more than" in err and len(err) < 400


@pytest.mark.parametrize(
    "text,where",
    [
        ("precision:\n  mode: [bf16\n", "line 3, column 1"),
        ("device: cpu\n  precision: x\n", "line 2, column 12"),
    ],
)
def test_malformed_config_exits_2_with_file_line_and_column(capsys, tmp_path, text, where):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    code, out, err = _run(capsys, "--config", str(path))
    assert code == 2 and "Traceback" not in err
    assert "broken.yaml" in err and "not valid YAML" in err and where in err


def test_config_that_is_a_directory_says_so(capsys, tmp_path):
    code, _, err = _run(capsys, "--config", str(tmp_path))
    assert code == 2 and "is a directory" in err and "got str" not in err


@pytest.mark.parametrize(
    ("framework", "expected"),
    [
        ("pytorch", 'torch.autocast(device_type="cuda", dtype=torch.float16)'),
        ("lightning", 'precision="16-mixed"'),
        ("accelerate", 'mixed_precision="fp16"'),
        ("transformers", "fp16=True"),
    ],
)
def test_as_prints_the_plan_as_code(capsys, framework, expected):
    code, out, err = _run(capsys, "--simulate", "cuda-no-bf16", "--as", framework.upper())
    assert code == 0 and not err
    assert expected in out and "simulated hardware (cuda-no-bf16)" in out
    assert "Precision plan:" not in out  # the script only, ready for `> train.py`
    compile(out, "<plan --as>", "exec")


def test_as_follows_the_flags_and_goes_into_json(capsys):
    code, out, _ = _run(capsys, "--device", "cpu", "--mode", "fp16", "--loss-scale-lab", "--as",
                        "accelerate", "--json")  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["code"]["framework"] == "accelerate"
    assert 'mixed_precision="no"' in data["code"]["text"]
    assert "loss-scale lab" in data["code"]["text"]


def test_as_an_unknown_framework_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "--as", "keras"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--as: invalid value 'keras'; allowed: pytorch, lightning, accelerate" in err
