"""A model that raises from its first call, and ``device="meta"``, in every entry point.

Both once ended in ``ZeroDivisionError: integer modulo by zero``: every plan failed in warm-up,
so the measurement rotated the order of zero plans. Now the user's own error (or a clear refusal
of the meta device) reaches the command line, ``pnb.profile()`` and the panel's Compare.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import precision_nb as pnb
from precision_nb.cli.main import main
from precision_nb.engine.measure import run_rounds

MESSAGE = "the model is broken on purpose"


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(MESSAGE)


def batches() -> list:
    return [(torch.randn(8, 4), torch.randint(0, 2, (8,)))]


def test_rounds_without_any_plan_left_do_nothing() -> None:
    rounds = run_rounds({}, [2, 2])
    assert rounds.blocks == {} and rounds.orders == [] and rounds.failures == {}


def test_profile_in_python_raises_the_models_own_error(tmp_path) -> None:
    with pytest.raises(RuntimeError, match=MESSAGE) as info:
        pnb.profile(
            Broken(), batches(), compare=("fp32", "bf16"), steps=2, rounds=1, progress=False,
            inspect=False, numerics=False, out=tmp_path / "out",
        )  # fmt: skip
    assert type(info.value) is RuntimeError  # the model's own error, not a wrapper
    comparison = info.value.result  # the comparison travels with the error
    assert set(comparison.failures) == {"fp32", "bf16"}
    assert all("failed in warm-up" in why for why in comparison.failures.values())


def test_panel_compare_shows_the_models_own_error() -> None:
    panel = pnb.Panel(Broken(), batches(), compare_plans=("fp32", "bf16"), steps=2)
    try:
        with pytest.raises(RuntimeError, match=MESSAGE):
            panel.compare(block=True, timeout=120)
        assert MESSAGE in (panel.error or "") and "ZeroDivisionError" not in panel.error
    finally:
        panel.close()


def test_meta_device_is_refused_in_python_and_on_the_command_line(tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match="'meta' holds shapes without data"):
        pnb.profile("mlp", preset="tiny", device="meta", steps=2, progress=False)
    with pytest.raises(ValueError, match="'meta' holds shapes without data"):
        pnb.fit("mlp", preset="tiny", device="meta", steps=2)
    out = tmp_path / "out"
    args = ["--preset", "tiny", "--steps", "2", "--no-progress", "--out", str(out)]
    assert main(["profile", "--device", "meta", *args]) == 2
    err = capsys.readouterr().err
    assert "'meta' holds shapes without data" in err and "ZeroDivisionError" not in err
    assert not out.exists()


def test_the_panel_compare_on_a_meta_device_shows_the_refusal() -> None:
    panel = pnb.Panel(device="meta", workload="mlp", preset="tiny", steps=2)
    try:
        with pytest.raises(ValueError, match="'meta' holds shapes without data"):
            panel.compare(block=True, timeout=120)
        assert "'meta' holds shapes without data" in (panel.error or "")
        assert "ZeroDivisionError" not in panel.error
    finally:
        panel.close()
