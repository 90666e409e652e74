"""Fixtures for the browser test: a JupyterLab server on 127.0.0.1 and Debian's headless Chromium.

The server gets a free port, a random token and a temporary root holding a copy of the notebooks;
it is always shut down, even when a test fails. No browser is downloaded: Playwright drives the
system Chromium through ``executable_path``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lab_process import stop_group, wait_until_up

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("PRECISION_NB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
ARTIFACTS = Path(os.environ.get("PRECISION_NB_ARTIFACTS", ROOT / "artifacts"))


@dataclass(frozen=True)
class LabServer:
    url: str
    token: str
    root: Path

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}&reset"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_lab_settings(settings: Path) -> None:
    """Start the notebook's kernel without a dialog, and never ask to fetch news."""
    user = settings / "@jupyterlab"
    (user / "notebook-extension").mkdir(parents=True)
    (user / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        '{"autoStartDefaultKernel": true}'
    )
    (user / "apputils-extension").mkdir(parents=True)
    (user / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have Chromium at {CHROMIUM} (.ci/run installs Debian's chromium)")
        if os.environ.get("PRECISION_NB_UPDATE_SCREENSHOT") == "1":
            pytest.fail(f"retaking the README's image needs Chromium at {CHROMIUM}")
        pytest.skip(
            f"Chromium not found at {CHROMIUM}; PRECISION_NB_CHROMIUM can name another one "
            "(enable: apt-get install -y chromium)"
        )
    return CHROMIUM


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def lab_server(
    chromium_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LabServer]:
    root = tmp_path_factory.mktemp("lab-root")
    source = Path(os.environ.get("PRECISION_NB_NOTEBOOKS", ROOT / "notebooks"))
    for notebook in source.glob("*.ipynb"):
        shutil.copy(notebook, root / notebook.name)
    home = tmp_path_factory.mktemp("lab-home")
    port, token = _free_port(), secrets.token_hex(16)
    log = root.parent / "jupyterlab.log"
    _write_lab_settings(home / "settings")
    env = dict(os.environ)
    env.update(
        {
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
            "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
            "MPLBACKEND": "Agg",
        }
    )
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--ServerApp.root_dir={root}",
        f"--IdentityProvider.token={token}",
        "--ServerApp.disable_check_xsrf=False",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, token, proc, log, timeout=90)
        yield LabServer(url=url, token=token, root=root)
    finally:
        stop_group(proc)


@pytest.fixture
def browser_page(chromium_path: Path, tmp_path: Path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(chromium_path),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 2600},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()
