"""scripts/lab.sh (JupyterLab as the README prints it, also as root) and what scripts/test.sh
says last: the tests it skipped and the command that enables them (scripts/skipped_summary.py)."""

from __future__ import annotations

import importlib.util
import os
import secrets
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from lab_process import stop_group, wait_until_up

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "skipped_summary", ROOT / "scripts/skipped_summary.py"
)
skipped_summary = importlib.util.module_from_spec(_spec)
sys.modules["skipped_summary"] = skipped_summary  # dataclasses look their module up there
_spec.loader.exec_module(skipped_summary)

JUPYTER = ROOT / ".venv/bin/jupyter"
needs_jupyter = pytest.mark.skipif(
    not JUPYTER.exists(), reason="JupyterLab is not in .venv (enable: bash scripts/setup.sh test)"
)


# -- scripts/lab.sh ------------------------------------------------------------------------------


def _fake_id(tmp_path: Path, uid: int) -> dict[str, str]:
    """An environment whose `id -u` answers ``uid``."""
    bin_dir = tmp_path / f"uid-{uid}"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "id"
    fake.write_text(f"#!/bin/sh\necho {uid}\n")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PRECISION_NB_DRY_RUN": "1"}


def _lab_dry_run(tmp_path: Path, uid: int, *args: str) -> list[str]:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/lab.sh"), *args],
        env=_fake_id(tmp_path, uid),
        capture_output=True,
        text=True,
        check=True,
    )
    line = done.stdout.strip()
    assert line.startswith("+ "), done.stdout
    return shlex.split(line[2:])


@needs_jupyter
@pytest.mark.parametrize(("uid", "allow_root"), [(0, True), (1000, False)])
def test_lab_adds_allow_root_only_for_root(tmp_path, uid, allow_root) -> None:
    command = _lab_dry_run(tmp_path, uid)
    assert command[:2] == [str(JUPYTER), "lab"]
    assert ("--allow-root" in command) is allow_root
    assert command[-1] == str(ROOT / "notebooks")  # the tutorial by default, from any folder
    given = _lab_dry_run(tmp_path, uid, "--no-browser", "notebooks/02_mixed_precision.ipynb")
    assert given[-2:] == ["--no-browser", "notebooks/02_mixed_precision.ipynb"]


def test_lab_without_jupyterlab_says_what_to_run(tmp_path) -> None:
    fake_root = tmp_path / "checkout"
    (fake_root / "scripts").mkdir(parents=True)
    (fake_root / "scripts/lab.sh").write_text((ROOT / "scripts/lab.sh").read_text())
    done = subprocess.run(
        ["bash", str(fake_root / "scripts/lab.sh")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and "run bash scripts/demo.sh first" in done.stderr


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@needs_jupyter
def test_lab_starts_jupyterlab_for_whoever_runs_it(tmp_path) -> None:
    """As root too: the server answers, then it is stopped at once (a few seconds in all)."""
    port, token = _free_port(), secrets.token_hex(8)
    home = tmp_path / "home"
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
    }
    env.pop("PRECISION_NB_DRY_RUN", None)
    args = [
        "--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={tmp_path}", "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    log = tmp_path / "lab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "scripts/lab.sh"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:  # raises, with the server's log, unless it answers within 120 s
        wait_until_up(f"http://127.0.0.1:{port}", token, proc, log, timeout=120)
    finally:
        stop_group(proc)


# -- what scripts/test.sh says last ---------------------------------------------------------------

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5" skipped="3">
<testcase classname="tests.browser.test_panel_in_jupyterlab" name="test_panel" time="0.001">
<skipped type="pytest.skip" message="Chromium not found at /usr/bin/chromium (enable: apt-get install -y chromium)">tests/browser/test_panel_in_jupyterlab.py:59: Chromium not found at /usr/bin/chromium (enable: apt-get install -y chromium)</skipped></testcase>
<testcase classname="tests.core.test_core_amp.TestCuda" name="test_real" time="0.001">
<skipped type="pytest.skip" message="a real CUDA device is present">tests/core/test_core_amp.py:165: a real CUDA device is present</skipped></testcase>
<testcase classname="tests.core.test_core_amp" name="test_other" time="0.001">
<skipped type="pytest.skip" message="a real CUDA device is present">tests/core/test_core_amp.py:170: a real CUDA device is present</skipped></testcase>
<testcase classname="tests.core.test_x" name="test_xfail" time="0.001"><skipped type="pytest.xfail" message="known"/></testcase>
<testcase classname="tests.core.test_x" name="test_ok" time="0.001"/>
</testsuite></testsuites>
"""  # noqa: E501 - pytest's own report, as written


def test_the_summary_names_each_skip_and_ends_with_the_command_that_enables_it(tmp_path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(REPORT)
    skips = skipped_summary.read_skips(report)
    assert [(s.files, s.count) for s in skips] == [
        (("tests/browser/test_panel_in_jupyterlab.py",), 1),
        (("tests/core/test_core_amp.py",), 2),
    ]
    lines = skipped_summary.summary_lines(skips)
    assert "Chromium not found at /usr/bin/chromium" in lines[1]
    assert "(2 tests): a real CUDA device is present" in lines[2]
    assert lines[-1] == (
        "scripts/test.sh: 3 tests were SKIPPED: tests/browser/test_panel_in_jupyterlab.py "
        "(to run it: apt-get install -y chromium); tests/core/test_core_amp.py"
    )


def test_the_summary_says_so_when_nothing_was_skipped_or_it_cannot_tell(tmp_path, capsys) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(REPORT.split("<testcase")[0] + "</testsuite></testsuites>\n")
    assert skipped_summary.main([str(report)]) == 0
    assert capsys.readouterr().out == "scripts/test.sh: nothing skipped\n"
    assert skipped_summary.main([str(tmp_path / "missing.xml")]) == 0
    assert "cannot tell what was skipped" in capsys.readouterr().out


def test_the_browser_skip_names_its_enabling_command() -> None:
    conftest = (ROOT / "tests/browser/conftest.py").read_text()
    assert "(enable: apt-get install -y chromium)" in conftest


def test_test_sh_prints_the_summary_after_pytest_and_keeps_its_exit_code() -> None:
    script = (ROOT / "scripts/test.sh").read_text()
    pytest_at = script.index("python -m pytest tests notebooks")
    summary_at = script.index('python scripts/skipped_summary.py "$report"')
    assert '--junitxml="$report"' in script[pytest_at:summary_at]
    assert pytest_at < summary_at < script.index('exit "$rc"')
