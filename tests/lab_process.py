"""A JupyterLab server a test started in its own session: wait until it answers, stop its whole
process group. Shared by the browser tests and the test of scripts/lab.sh."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def wait_until_up(url: str, token: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Return once ``url``'s /api/status answers 200; RuntimeError (with the end of ``log``) when
    the server exits first or does not answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.3)
    raise RuntimeError(
        f"JupyterLab did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}"
    )


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group ``proc`` leads (started with ``start_new_session=True``), then
    SIGKILL it when it has not ended after 20 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
