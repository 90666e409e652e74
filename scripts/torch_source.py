"""Where ``scripts/setup.sh`` installs torch from: prints pip's index arguments, one per line.

PyPI's torch wheel for Linux is the CUDA build (several GB with its NVIDIA libraries); PyTorch's
CPU index serves the CPU build (a few hundred MB). Without an NVIDIA driver the CUDA build cannot
use a GPU, so on Linux without a driver the CPU index is used, unless pip already resolves the
requirement to a CPU build from its own sources (a local wheel folder or a mirror that serves
``+cpu`` builds), or the user chose an index. With a driver, plain pip gives the CUDA build.

Settings, from the environment:

``PRECISION_NB_TORCH``
    the requirement (``scripts/setup.sh`` passes it; default ``torch==2.13.0``)
``PRECISION_NB_TORCH_INDEX``
    ``auto`` (default, as above), ``cpu`` (always PyTorch's CPU index), ``default`` (pip's own
    configuration, whatever the machine) or an index URL such as
    ``https://download.pytorch.org/whl/cu128`` (that index first, PyPI for the rest)
``PIP_INDEX_URL`` / ``PIP_EXTRA_INDEX_URL``, or an ``index-url`` in pip's configuration
    an index the user chose: ``auto`` then leaves pip's configuration as it is

Usage: ``python scripts/torch_source.py REQUIREMENT`` (stdlib only: it runs before anything is
installed). The reason for the choice goes to stderr; a bad setting exits with 2.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI = "https://pypi.org/simple"
SETTINGS = ("auto", "cpu", "default")


@dataclass(frozen=True)
class Choice:
    """pip arguments that go before the requirement, and why."""

    args: tuple[str, ...]
    reason: str


def index_choice(url: str, reason: str) -> Choice:
    return Choice(("--index-url", url, "--extra-index-url", PYPI), reason)


def nvidia_driver_present(
    which: Callable[[str], str | None] = shutil.which, proc: Path = Path("/proc/driver/nvidia")
) -> bool:
    """An NVIDIA driver is installed: ``nvidia-smi`` on PATH or the kernel driver's /proc entry."""
    return which("nvidia-smi") is not None or proc.exists()


def user_index(env: Mapping[str, str], pip_config: str) -> str | None:
    """The index the user chose (environment or pip's configuration), or None."""
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        if env.get(name, "").strip():
            return f"{name} is set"
    for line in pip_config.splitlines():
        key = line.split("=", 1)[0].strip()
        if key.endswith(".index-url") and not key.endswith("extra-index-url"):
            return f"pip's configuration sets {key}"
    return None


def resolved_version(python: str, requirement: str) -> str | None:
    """The torch version pip's own sources give for ``requirement``, without installing it.

    ``pip install --dry-run --report`` reads metadata only (a local wheel, or the index's metadata
    file), so nothing large is downloaded. None when pip cannot say.
    """
    command = [python, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed"]
    command += ["--quiet", "--disable-pip-version-check", "--report", "-", requirement]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    try:
        installs = json.loads(done.stdout)["install"]
    except (ValueError, KeyError, TypeError):
        return None
    versions = [i["metadata"]["version"] for i in installs if i["metadata"]["name"] == "torch"]
    return versions[0] if versions else None


def choose(
    requirement: str,
    setting: str,
    *,
    system: str,
    chosen_index: str | None,
    driver: bool,
    resolve: Callable[[], str | None],
) -> Choice:
    """Decide the index; ``resolve`` (what plain pip would install) is called only when needed."""
    setting = setting.strip() or "auto"
    if "://" in setting:
        return index_choice(setting, f"PRECISION_NB_TORCH_INDEX={setting}")
    if setting not in SETTINGS:
        raise ValueError(
            f"PRECISION_NB_TORCH_INDEX: invalid value {setting!r}; allowed: "
            f"{', '.join(SETTINGS)}, or an index URL (https://...)"
        )
    if setting == "default":
        return Choice((), "PRECISION_NB_TORCH_INDEX=default: pip's own configuration")
    cpu_reason = "PyTorch's CPU index, for the CPU build"
    if setting == "cpu":
        return index_choice(CPU_INDEX, f"PRECISION_NB_TORCH_INDEX=cpu: {cpu_reason}")
    if chosen_index:
        return Choice((), f"{chosen_index}: pip's configuration decides")
    if system != "Linux":
        return Choice((), f"{system}: pip's default torch has no CUDA libraries to skip here")
    if driver:
        return Choice((), "an NVIDIA driver is present: pip's default torch is the CUDA build")
    version = resolve()
    if version and "+cpu" in version:
        return Choice((), f"pip's own sources give {requirement} as {version}, a CPU build")
    found = f" (pip's own sources give {version})" if version else ""
    return index_choice(CPU_INDEX, f"no NVIDIA driver found{found}: {cpu_reason}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: torch_source.py REQUIREMENT", file=sys.stderr)
        return 2
    requirement = argv[0]
    config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    try:
        choice = choose(
            requirement,
            os.environ.get("PRECISION_NB_TORCH_INDEX", "auto"),
            system=platform.system(),
            chosen_index=user_index(os.environ, config.stdout),
            driver=nvidia_driver_present(),
            resolve=lambda: resolved_version(sys.executable, requirement),
        )
    except ValueError as error:
        print(f"scripts/setup.sh: {error}", file=sys.stderr)
        return 2
    print(f"torch: {choice.reason}", file=sys.stderr)
    for arg in choice.args:
        print(arg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
