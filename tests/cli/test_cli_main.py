"""What every command shares: --version, exit codes, a closed pipe, flags checked before torch."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from precision_nb import __version__
from precision_nb.cli.main import build_parser, cli_text, main

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _cli(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "precision_nb.cli.main", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=ENV,
        timeout=120,
        **kwargs,
    )


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"precision-nb {__version__}"


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--device", "gpu"],
        ["plan", "--mode", "fp8"],
        ["plan", "--simulate", "a100"],
        ["plan", "--config", "no-such-file.yaml"],
        ["profile", "--steps", "0"],
        ["profile", "--workload", "resnet"],
        ["profile", "--compare", "fp32,fp8"],
        ["profile", "--device", "tpu"],
        ["profile", "--steps", "1000000000000"],
        ["inspect", "--workload", "resnet"],
        ["inspect", "--precision", "fp8"],
        ["inspect", "--device", "gpu"],
    ],
)
def test_a_bad_flag_is_answered_before_torch_is_imported(argv):
    code = (
        "import sys\n"
        "from precision_nb.cli.main import main\n"
        f"code = main({argv!r})\n"
        "print(code, 'torch' in sys.modules)\n"
    )
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=ENV, timeout=60
    )
    elapsed = time.perf_counter() - start
    assert proc.stdout.split() == ["2", "False"], proc.stderr
    assert "error:" in proc.stderr and "Traceback" not in proc.stderr
    print(f"{argv}: answered in {elapsed:.2f} s")


def test_a_closed_pipe_ends_quietly():
    proc = subprocess.Popen(
        [sys.executable, "-m", "precision_nb.cli.main", "plan", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=ENV,
    )
    proc.stdout.close()  # like `| head -1` that exited before the output came
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_a_shell_pipe_into_head_prints_one_line():
    proc = subprocess.run(
        f"{sys.executable} -m precision_nb.cli.main plan --json | head -1",
        shell=True,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=ENV,
        timeout=120,
    )
    assert proc.stdout == "{\n"
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_interrupt_exits_130_with_one_line(monkeypatch, capsys):
    from precision_nb.cli import plan

    def interrupted(args, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan, "_explain", interrupted)
    assert main(["plan"]) == 130
    err = capsys.readouterr().err
    assert err == "precision-nb plan: interrupted\n"


def test_usage_error_exits_2():
    proc = _cli("plan", "--no-such-flag")
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr
    assert "Traceback" not in proc.stderr


def _help(command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command].format_help()


@pytest.mark.parametrize("command", ["plan", "profile"])
def test_every_option_shows_its_default(command):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    shown = [
        a
        for a in sub._actions
        if a.option_strings and a.help != "==SUPPRESS==" and a.dest != "help"
    ]
    assert len(shown) >= 8
    formatter = sub._get_formatter()
    for action in shown:
        assert "default" in formatter._expand_help(action), action.option_strings[0]


def test_profile_help_names_the_defaults_it_runs_with():
    text = " ".join(_help("profile").split())
    assert "(default: mlp)" in text
    assert "(default: small)" in text
    from precision_nb.core import defaults

    assert f"(default: {defaults.DEFAULT_STEPS})" in text
    assert f"(default: {defaults.DEFAULT_ROUNDS}, or one per step" in text


def test_profile_defaults_are_the_engines():
    from precision_nb.cli import profile as cli_profile
    from precision_nb.core.capabilities import PRESETS as HARDWARE
    from precision_nb.engine import workloads

    assert set(cli_profile.WORKLOAD_NAMES) == set(workloads.WORKLOADS) | set(workloads._ALIASES)
    assert cli_profile.PRESET_NAMES == workloads.PRESETS
    from precision_nb.core import distributed

    assert cli_profile.STRATEGIES == distributed.STRATEGIES
    assert cli_profile.COMM_HOOKS == distributed.COMM_HOOKS

    from precision_nb.cli.plan import SIMULATE_PRESETS

    assert SIMULATE_PRESETS == tuple(HARDWARE)


def test_plan_output_uses_cli_spellings(capsys):
    assert main(["plan", "--device", "cpu", "--mode", "fp16", "--fused", "true"]) == 0
    out = capsys.readouterr().out
    assert "--loss-scale-lab" in out and "loss_scale_lab=True" not in out
    assert main(["plan", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "--fused true" in out and "optimizer.fused" not in out and "fused=True" not in out


def test_cli_text_rewrites_python_spellings_only():
    text = "use PrecisionConfig(mode='fp16', loss_scale_lab=True) or set optimizer.fused=true"
    assert cli_text(text) == "use --mode fp16 --loss-scale-lab or set --fused true"
    assert cli_text("nothing to change") == "nothing to change"
    escaped = html.escape(text)  # as a report page holds it
    assert cli_text(escaped) == html.escape("use --mode fp16 --loss-scale-lab or set --fused true")


def test_json_stays_data(capsys):
    assert main(["plan", "--json", "--device", "cpu", "--mode", "fp16"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["loss_scale_lab"] is False
