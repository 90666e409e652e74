"""binder/ must give a CPU-only Binder the same dependencies as pyproject.toml, and the package."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _binder_requirements() -> tuple[list[str], dict[str, Requirement]]:
    options, reqs = [], {}
    for raw in (BINDER / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-"):
            options.append(line)
            continue
        req = Requirement(line)
        reqs[req.name.lower()] = req
    return options, reqs


def test_every_runtime_dependency_is_in_binder_with_the_same_specifier():
    _, reqs = _binder_requirements()
    for dep in _pyproject()["project"]["dependencies"]:
        want = Requirement(dep)
        name = want.name.lower()
        assert name in reqs, f"binder/requirements.txt lacks {want.name} (pyproject: {dep})"
        if name == "torch":
            continue  # binder pins the exact CPU build; checked below
        assert reqs[name].specifier == want.specifier, (
            f"{want.name}: binder has '{reqs[name].specifier}', pyproject has '{want.specifier}'"
        )


def test_binder_has_no_dependency_that_pyproject_does_not_declare():
    _, reqs = _binder_requirements()
    project = _pyproject()["project"]
    declared = {Requirement(d).name.lower() for d in project["dependencies"]}
    declared |= {Requirement(d).name.lower() for d in project["optional-dependencies"]["notebook"]}
    declared |= {Requirement(d).name.lower() for d in project["optional-dependencies"]["remedies"]}
    assert set(reqs) <= declared, f"undeclared in pyproject: {sorted(set(reqs) - declared)}"


def test_binder_installs_the_remedies_extra_for_the_true_precision_notebook():
    _, reqs = _binder_requirements()
    for dep in _pyproject()["project"]["optional-dependencies"]["remedies"]:
        want = Requirement(dep)
        assert reqs[want.name.lower()].specifier == want.specifier, want.name


def _admitted(spec: SpecifierSet) -> set[str]:
    """The versions of a grid (majors 0-3, minors 0-30) that spec admits: two specifiers spelled
    differently (``==0.18.*``, ``>=0.18,<0.19``) admit the same set there."""
    grid = [f"{a}.{b}.{c}" for a in range(4) for b in range(31) for c in (0, 1, 9)]
    return {v for v in grid if Version(v) in spec}


def test_binder_installs_the_blocks_extra_for_the_block_formats_section():
    _, reqs = _binder_requirements()
    for dep in _pyproject()["project"]["optional-dependencies"]["blocks"]:
        want = Requirement(dep)
        assert want.name.lower() in reqs, f"binder/requirements.txt lacks {want.name}"
        have = _admitted(reqs[want.name.lower()].specifier)
        assert have and have <= _admitted(want.specifier), (
            f"{want.name}: binder has '{reqs[want.name.lower()].specifier}', "
            f"the blocks extra allows '{want.specifier}'"
        )


def test_torch_is_the_cpu_build_of_the_version_the_setup_script_installs():
    options, reqs = _binder_requirements()
    assert any("download.pytorch.org/whl/cpu" in o for o in options), options
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pinned = re.search(r"PRECISION_NB_TORCH:-torch==([0-9.]+)", setup).group(1)
    assert str(reqs["torch"].specifier) == f"=={pinned}"
    project_spec = SpecifierSet(
        str(
            Requirement(
                next(d for d in _pyproject()["project"]["dependencies"] if d.startswith("torch"))
            ).specifier
        )
    )
    assert Version(pinned) in project_spec


def test_jupyterlab_is_installed_and_the_package_itself_by_post_build():
    _, reqs = _binder_requirements()
    assert "jupyterlab" in reqs
    post = (BINDER / "postBuild").read_text()
    assert post.startswith("#!/bin/bash")
    assert "set -e" in post
    assert re.search(r"pip install .*-e \.", post), post


def test_runtime_python_satisfies_requires_python():
    version = (BINDER / "runtime.txt").read_text().strip().removeprefix("python-")
    assert Version(version) in SpecifierSet(_pyproject()["project"]["requires-python"])
