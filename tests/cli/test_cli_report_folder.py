"""`precision-nb profile --out`: interrupted, killed, disk-full, read-only runs keep it intact."""

from __future__ import annotations

import errno
import os
import pathlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from precision_nb.cli.main import main
from precision_nb.views.report import folder
from precision_nb.views.report.html import OUTPUT_FILES, write_report

#: The engine's comparison, replaced by a fake where a test needs no measurement.
COMPARE = "precision_nb.engine.compare.run_comparison"

# The fake comparisons below have records only: no model to inspect or analyse.
ARGS = (
    "profile", "--no-progress", "--preset", "tiny", "--steps", "2", "--compare", "fp32",
    "--no-inspect", "--no-numerics",
)  # fmt: skip


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _dirs(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir())


@pytest.fixture
def fake(make_result, make_comparison):
    return make_comparison(fp32=make_result("fp32", "fp32"))


@pytest.fixture
def old_report(tmp_path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").write_text("previous report")
    (out / "metrics.csv").write_text("previous metrics")
    (out / "notes.txt").write_text("mine")
    return out


def test_ctrl_c_during_the_run_leaves_out_as_it_was(tmp_path, old_report, monkeypatch, capsys):
    def interrupted(request, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(COMPARE, interrupted)
    before = _snapshot(tmp_path)
    assert main([*ARGS, "--out", str(old_report)]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and "left as it was" in err
    assert _snapshot(tmp_path) == before
    assert _dirs(tmp_path) == ["out"]


def test_a_stopped_comparison_writes_nothing(tmp_path, old_report, monkeypatch, capsys, fake):
    fake.stopped = True  # the engine turned Ctrl-C into a stop between steps
    monkeypatch.setattr(COMPARE, lambda request, **kwargs: fake)
    before = _snapshot(tmp_path)
    assert main([*ARGS, "--out", str(old_report)]) == 130
    assert _snapshot(tmp_path) == before


def test_ctrl_c_while_the_report_is_written_leaves_out_as_it_was(
    tmp_path, old_report, monkeypatch, fake
):
    monkeypatch.setattr(COMPARE, lambda request, **kwargs: fake)
    real = pathlib.Path.write_bytes
    written = []

    def interrupted(self, data):
        written.append(self.name)
        real(self, data)
        if len(written) == 3:  # a few files are staged when Ctrl-C lands
            raise KeyboardInterrupt

    monkeypatch.setattr(pathlib.Path, "write_bytes", interrupted)
    before = _snapshot(tmp_path)
    assert main([*ARGS, "--out", str(old_report)]) == 130
    assert len(written) == 3
    assert _snapshot(tmp_path) == before
    assert _dirs(tmp_path) == ["out"]


def test_a_stop_that_arrives_while_writing_leaves_out_as_it_was(
    tmp_path, old_report, monkeypatch, fake
):
    """The CLI's first Ctrl-C sets the stop flag: the write then ends without moving anything."""
    import threading

    from precision_nb.cli import profile as cli_profile

    monkeypatch.setattr(COMPARE, lambda request, **kwargs: fake)
    real = pathlib.Path.write_bytes
    stops: list[threading.Event] = []
    real_stops = cli_profile._ctrl_c_stops

    def capture(stop):
        stops.append(stop)
        return real_stops(stop)

    def write_then_stop(self, data):
        real(self, data)
        stops[0].set()  # as the first Ctrl-C does

    monkeypatch.setattr(cli_profile, "_ctrl_c_stops", capture)
    monkeypatch.setattr(pathlib.Path, "write_bytes", write_then_stop)
    before = _snapshot(tmp_path)
    assert main([*ARGS, "--out", str(old_report)]) == 130
    assert _snapshot(tmp_path) == before
    assert _dirs(tmp_path) == ["out"]


# A driver that runs the CLI with every staged write slowed down and announced in a marker file,
# so a signal can be sent while the report files are being written.
_SLOW_WRITES = """
import pathlib, sys, time
marker = pathlib.Path(sys.argv[1])
real = pathlib.Path.write_bytes
def slow(self, data):
    if self.parent.name.endswith(".partial"):
        marker.write_text(self.name)
        time.sleep(0.4)
    return real(self, data)
pathlib.Path.write_bytes = slow
from precision_nb.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def _start_writing(tmp_path: Path, out: Path) -> tuple[subprocess.Popen, Path]:
    """The CLI (a real, short profile) in a subprocess, returned once it writes the report."""
    repo = Path(__file__).resolve().parents[2]
    driver, marker = tmp_path / "driver.py", tmp_path / "writing"
    driver.write_text(_SLOW_WRITES)
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(marker), *ARGS, "--device", "cpu", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the report was never written"
        time.sleep(0.05)
    return proc, marker


def test_a_real_ctrl_c_while_the_report_is_written_keeps_the_old_report(tmp_path, old_report):
    import signal

    before = _snapshot(old_report)
    proc, marker = _start_writing(tmp_path, old_report)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].endswith("was left as it was")
    assert _snapshot(old_report) == before
    assert _dirs(old_report) == []


def test_a_kill_while_the_report_is_written_leaves_a_staging_folder_the_next_run_removes(
    tmp_path, old_report, monkeypatch
):
    import signal

    before = _snapshot(old_report)
    proc, _ = _start_writing(tmp_path, old_report)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    staged = _dirs(old_report)
    assert len(staged) == 1 and staged[0].endswith(".partial")  # what SIGKILL cannot clean
    after = _snapshot(old_report)
    assert {k: v for k, v in after.items() if not k.startswith(staged[0])} == before

    def interrupted(request, **kwargs):  # even a next run that is itself interrupted
        raise KeyboardInterrupt

    monkeypatch.setattr(COMPARE, interrupted)
    assert main([*ARGS, "--out", str(old_report)]) == 130
    assert _dirs(old_report) == []
    assert _snapshot(old_report) == before


def test_interrupting_a_new_folder_leaves_no_folder(tmp_path, monkeypatch):
    def interrupted(request, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(COMPARE, interrupted)
    assert main([*ARGS, "--out", str(tmp_path / "new")]) == 130
    assert list(tmp_path.iterdir()) == []


def test_a_failed_move_puts_the_old_report_back(tmp_path, old_report, monkeypatch, fake):
    monkeypatch.setattr(COMPARE, lambda request, **kwargs: fake)
    real_replace = os.replace
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 4:  # after the backups, while new files go in
            raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(folder.os, "replace", flaky)
    before = _snapshot(tmp_path)
    assert main([*ARGS, "--out", str(old_report)]) == 1
    assert _snapshot(tmp_path) == before
    assert _dirs(tmp_path) == ["out"]


def test_disk_full_keeps_the_old_report_and_says_what_and_how_much(
    tmp_path, old_report, monkeypatch, capsys, fake, full_disk
):
    monkeypatch.setattr(COMPARE, lambda request, **kwargs: fake)
    full_disk(".png")
    before = _snapshot(tmp_path)
    assert main([*ARGS, "--out", str(old_report)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert "could not write" in err and ".png" in err and "No space left on device" in err
    assert "MiB free" in err and "left as it was" in err
    assert _snapshot(tmp_path) == before
    assert _dirs(tmp_path) == ["out"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_partial_folders_are_removed_on_the_next_run(tmp_path, old_report, monkeypatch, fake):
    monkeypatch.setattr(COMPARE, lambda request, **kwargs: fake)
    dead = old_report / f".precision-nb.{_dead_pid()}.abc.partial"
    live = old_report / f".precision-nb.{os.getppid()}.def.partial"
    old = old_report / f".precision-nb.{os.getppid()}.ghi.partial"
    for path in (dead, live, old):
        path.mkdir()
        (path / "report.html").write_text("half")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    assert main([*ARGS, "--out", str(old_report)]) == 0
    assert not dead.exists() and not old.exists()
    assert live.exists()  # another process, still running, recently active: may be writing
    assert (old_report / "notes.txt").read_text() == "mine"
    assert (old_report / "report.html").read_text() != "previous report"


def test_out_dot_with_a_read_only_parent_works(tmp_path, monkeypatch, fake, capsys):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setattr(COMPARE, lambda request, **kwargs: fake)
    # The suite may run as root, where permission bits do not stop writes; ask os.access instead.
    monkeypatch.setattr(folder.os, "access", lambda path, mode: Path(path).resolve() != tmp_path)
    assert main([*ARGS, "--out", "."]) == 0
    assert (here / "report.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]


def test_out_dot_that_is_read_only_is_refused_naming_the_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(folder.os, "access", lambda path, mode: Path(path).resolve() != tmp_path)
    assert main([*ARGS, "--out", "."]) == 2
    err = capsys.readouterr().err
    assert f"folder '.' ({tmp_path}) is not writable" in err


def test_new_out_under_a_read_only_folder_names_that_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(folder.os, "access", lambda path, mode: Path(path) != tmp_path)
    assert main([*ARGS, "--out", str(tmp_path / "a" / "b")]) == 2
    err = capsys.readouterr().err
    assert "cannot be created" in err and f"{str(tmp_path)!r} is not writable" in err


def test_write_report_creates_a_missing_folder(tmp_path, fake):
    target = tmp_path / "not" / "yet"
    files = write_report(fake, target)
    assert set(files) == set(OUTPUT_FILES)
    assert all(path.parent == target and path.exists() for path in files.values())


def test_a_real_ctrl_c_stops_the_run_and_keeps_the_old_report(tmp_path, old_report):
    import signal

    repo = Path(__file__).resolve().parents[2]
    args = [*ARGS[:-4], "--steps", "1000000", "--device", "cpu", "--out", str(old_report)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "precision_nb.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    time.sleep(8)  # torch loads and the run starts; wherever it is, Ctrl-C must keep --out
    before = _snapshot(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].endswith("was left as it was")
    assert _snapshot(tmp_path) == before
    assert _dirs(tmp_path) == ["out"]


def test_first_ctrl_c_asks_the_run_to_stop_and_the_second_interrupts(capsys):
    import signal
    import threading

    from precision_nb.cli.profile import _ctrl_c_stops

    stop = threading.Event()
    before = signal.getsignal(signal.SIGINT)
    with _ctrl_c_stops(stop):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert signal.getsignal(signal.SIGINT) is before
    assert "stopping after this step" in capsys.readouterr().err
