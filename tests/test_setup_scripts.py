"""scripts/setup.sh: where torch comes from (scripts/torch_source.py), and its dry run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("torch_source", ROOT / "scripts/torch_source.py")
torch_source = importlib.util.module_from_spec(_spec)
sys.modules["torch_source"] = torch_source  # dataclasses look their module up there
_spec.loader.exec_module(torch_source)

REQ = "torch==2.13.0"
CPU_ARGS = ("--index-url", torch_source.CPU_INDEX, "--extra-index-url", torch_source.PYPI)


def choose(setting: str = "auto", **facts):
    """choose() on a Linux machine without a driver or a chosen index, unless facts say otherwise;
    ``resolved`` is what plain pip would install (the callable records whether it was asked)."""
    asked = []
    resolved = facts.pop("resolved", "2.13.0")

    def resolve():
        asked.append(True)
        return resolved

    options = {"system": "Linux", "chosen_index": None, "driver": False, **facts}
    return torch_source.choose(REQ, setting, resolve=resolve, **options), bool(asked)


def test_linux_without_driver_gets_the_cpu_index() -> None:
    choice, asked = choose(resolved="2.13.0")
    assert choice.args == CPU_ARGS and asked
    assert "no NVIDIA driver" in choice.reason and "2.13.0" in choice.reason


def test_a_cpu_build_from_pips_own_sources_is_kept() -> None:
    # a local wheel folder (find-links) or a mirror serving +cpu builds: no internet index needed
    choice, asked = choose(resolved="2.13.0+cpu")
    assert choice.args == () and asked and "2.13.0+cpu" in choice.reason


def test_when_pip_cannot_say_the_cpu_index_is_used() -> None:
    choice, _ = choose(resolved=None)
    assert choice.args == CPU_ARGS


def test_a_driver_gets_plain_pip_the_cuda_build() -> None:
    choice, asked = choose(driver=True)
    assert choice.args == () and not asked and "NVIDIA driver" in choice.reason


@pytest.mark.parametrize("system", ["Darwin", "Windows"])
def test_other_systems_get_plain_pip(system: str) -> None:
    choice, asked = choose(system=system)
    assert choice.args == () and not asked


def test_a_chosen_index_is_respected() -> None:
    choice, asked = choose(chosen_index="PIP_INDEX_URL is set")
    assert choice.args == () and not asked and "PIP_INDEX_URL" in choice.reason


def test_settings_override_detection() -> None:
    assert choose("cpu", driver=True)[0].args == CPU_ARGS
    assert choose("default")[0].args == ()
    url = "https://download.pytorch.org/whl/cu128"
    assert choose(url)[0].args == ("--index-url", url, "--extra-index-url", torch_source.PYPI)
    assert choose(" ")[0].args == CPU_ARGS  # empty means auto


def test_a_bad_setting_names_the_variable_and_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"PRECISION_NB_TORCH_INDEX.*'gpu'.*auto, cpu, default"):
        choose("gpu")


def test_driver_detection(tmp_path: Path) -> None:
    absent = tmp_path / "no-driver"
    assert not torch_source.nvidia_driver_present(lambda _: None, absent)
    assert torch_source.nvidia_driver_present(lambda name: f"/usr/bin/{name}", absent)
    absent.mkdir()
    assert torch_source.nvidia_driver_present(lambda _: None, absent)


def test_user_index_reads_the_environment_and_pip_config() -> None:
    local = "global.extra-index-url='file:///opt/pypi/simple'\n:env:.find-links='/opt/wheels'\n"
    assert torch_source.user_index({}, local) is None  # extra sources do not replace PyPI
    assert torch_source.user_index({"PIP_INDEX_URL": "https://mirror/simple"}, "")
    assert "global.index-url" in torch_source.user_index({}, "global.index-url='https://m/s'\n")


def test_dry_run_installs_torch_first_from_the_chosen_index_then_the_extra(setup_dry_run) -> None:
    env = {"PRECISION_NB_TORCH_INDEX": "cpu", "PRECISION_NB_TORCH": "torch>=2.13"}
    commands, log = setup_dry_run("test", **env)
    installs = [c for c in commands if c[1:4] == ["-m", "pip", "install"]]
    assert installs[0][-1] == "torch>=2.13"
    assert installs[0][-5:-1] == list(CPU_ARGS)
    assert installs[1][-2:] == ["-e", ".[test]"]
    assert installs[2][-2:] == ["--no-deps", "torchvision==0.28.0"]  # never a torch of its own
    assert len(installs) == 3
    assert "torch: PRECISION_NB_TORCH_INDEX=cpu" in log


def test_the_plain_install_gets_no_torchvision(setup_dry_run) -> None:
    commands, _ = setup_dry_run(PRECISION_NB_TORCH_INDEX="cpu")
    installs = [c for c in commands if c[1:4] == ["-m", "pip", "install"]]
    assert installs[-1][-2:] == ["-e", ".[notebook]"] and len(installs) == 2


def test_dry_run_refuses_a_bad_setting_and_an_unknown_extra(setup_dry_run) -> None:
    assert setup_dry_run(PRECISION_NB_TORCH_INDEX="gpu")[1] == "exit 2"
    assert setup_dry_run("gpu", PRECISION_NB_TORCH_INDEX="cpu")[1] == "exit 2"
