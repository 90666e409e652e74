"""benchmarks/gpu_check.py: clean skip without CUDA, and the engine check hook."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_prints_skipped_json_and_exits_0(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main() == 0
    report = json.loads(capsys.readouterr().out)
    assert report["skipped"] is True and "CUDA" in report["reason"]


def test_engine_hook_runs_the_engine_file(gpu_check, tmp_path):
    engine = tmp_path / "gpu_check_engine.py"
    engine.write_text("def run_checks():\n    return {'ok': True, 'steps': 3}\n")
    assert gpu_check.run_engine_checks(engine) == {"ok": True, "steps": 3}


def test_engine_hook_records_a_crash_and_a_missing_file(gpu_check, tmp_path):
    engine = tmp_path / "gpu_check_engine.py"
    engine.write_text("def run_checks():\n    raise RuntimeError('engine broke')\n")
    result = gpu_check.run_engine_checks(engine)
    assert result["ok"] is False and "engine broke" in result["error"]
    missing = gpu_check.run_engine_checks(tmp_path / "absent.py")
    assert missing["skipped"] is True
