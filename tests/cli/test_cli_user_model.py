"""``--model`` / ``--batches`` behave the same in every command (one loader: cli/user_model.py).

Each test runs from a temporary folder holding a package, as a user runs the command from their
project folder: the folder is NOT on sys.path beforehand, so the loader must make it importable.
"""

from __future__ import annotations

import itertools
import sys
import textwrap

import pytest

from precision_nb.cli import user_model as loader
from precision_nb.cli.main import main

CONVNET = textwrap.dedent(
    """
    import torch
    from torch import nn

    def make_model():
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))

    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 3, (4,))) for _ in range(2)]

    def batch_at(index):
        g = torch.Generator().manual_seed(index)
        return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 3, (4,), generator=g)

    def make_batches():
        return batches

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 2)

        def forward(self, x):
            raise RuntimeError("the user's model is broken")

    def make_broken():
        return Broken()

    broken_batches = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))]
    """
)

_COUNT = itertools.count()

# Quick settings per command; each must write its main file into --out.
COMMANDS = {
    "profile": (
        ["--steps", "2", "--rounds", "1", "--compare", "fp32", "--no-inspect", "--no-numerics"],
        "report.html",
    ),
    "inspect": (["--precision", "fp32"], "inspection.html"),
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with ``<pkg>/convnet.py``; the current folder, not on sys.path."""
    name = f"userpkg_{next(_COUNT)}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "convnet.py").write_text(CONVNET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        sys.modules.pop(module)


def _run(command, *argv, out):
    extra, _ = COMMANDS[command]
    quiet = ["--no-progress"] if command == "profile" else []
    return main([command, *argv, *extra, *quiet, "--out", str(out)])


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    "batches",
    [None, "{m}.convnet:batches", "{m}.convnet:batch_at", "{m}.convnet:make_batches"],
    ids=["default-name", "list", "index-callable", "zero-arg-factory"],
)
def test_a_package_in_the_current_folder_works_in_every_command(
    project, tmp_path, capsys, command, batches
):
    argv = ["--model", f"{project}.convnet:make_model"]
    if batches is not None:
        argv += ["--batches", batches.format(m=project)]
    out = tmp_path / "out"
    code = _run(command, *argv, out=out)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err
    assert (out / COMMANDS[command][1]).exists()


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    ("model", "batches", "message"),
    [
        ("nomodule_xyz.net:make", None, "--model: cannot import module 'nomodule_xyz.net'"),
        ("{m}.convnet", None, "--model: invalid value"),
        ("{m}.convnet:missing", None, "has no attribute 'missing'"),
        ("{m}.convnet:batches", None, "--model: {m}.convnet:batches is a list"),
        ("{m}:__name__", None, "is a str; allowed: a callable"),
        ("{m}.convnet:make_model", "{m}.convnet:nothing", "--batches: module"),
        ("{m}.convnet:make_model", "{m}:__name__", "--batches: {m}:__name__: batches has type str"),
    ],
)
def test_bad_model_or_batches_get_the_same_answer_in_every_command(
    project, tmp_path, capsys, command, model, batches, message
):
    argv = ["--model", model.format(m=project)]
    if batches is not None:
        argv += ["--batches", batches.format(m=project)]
    assert _run(command, *argv, out=tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert message.format(m=project) in err and "Traceback" not in err
    assert err.startswith(f"precision-nb {command}: error:")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_batches_without_model_is_refused_in_every_command(project, tmp_path, capsys, command):
    assert _run(command, "--batches", f"{project}.convnet:batches", out=tmp_path / "o") == 2
    assert "--batches: given without --model" in capsys.readouterr().err


def test_the_loader_adds_the_current_folder_once(project, tmp_path):
    import os

    module, obj = loader.load("--model", f"{project}.convnet:make_model")
    loader.load("--batches", f"{project}.convnet:batches")
    assert sys.path.count(os.getcwd()) == 1 and callable(obj)
    assert module.__name__ == f"{project}.convnet"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_model_that_raises_on_its_first_call_is_a_failed_run_with_its_own_error(
    project, tmp_path, capsys, command
):
    """Exit 1 with the model's message in every command (profile once ended in
    ``ZeroDivisionError``: every plan failing in warm-up left no plan to rotate)."""
    argv = ["--model", f"{project}.convnet:make_broken", "--batches"]
    argv += [f"{project}.convnet:broken_batches"]
    assert _run(command, *argv, out=tmp_path / "out") == 1
    err = capsys.readouterr().err
    assert "the user's model is broken" in err and "failed" in err
    assert "ZeroDivisionError" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
