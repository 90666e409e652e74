"""time_adamw: plain against fused AdamW per optimizer step, in paired rounds, with spread."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import precision_nb
from precision_nb.engine import adamw_timing
from precision_nb.engine.adamw_timing import time_adamw


def model() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    net[0].bias.requires_grad_(False)  # frozen tensors are not timed
    return net


def test_times_both_on_copies_and_leaves_the_model_alone():
    net = model()
    before = [p.detach().clone() for p in net.parameters()]
    timing = time_adamw(net, "cpu", rounds=3, seconds=0.001)
    assert precision_nb.time_adamw is time_adamw
    assert (timing.device, timing.tensors, timing.elements) == ("cpu", 3, 8 * 16 + 16 * 4 + 4)
    assert timing.rounds == 3 and timing.steps_per_round >= 1
    assert timing.plain_s > 0 and timing.fused_s > 0 and timing.fused_error is None
    assert timing.ratio_low <= timing.ratio <= timing.ratio_high
    assert all(p.equal(b) for p, b in zip(net.parameters(), before, strict=True))
    assert all(p.grad is None for p in net.parameters())
    text = timing.summary()
    assert "plain / fused" in text and "3 paired rounds" in text
    # every time in the sentence carries its unit, the IQRs too
    assert f"(IQR {timing.plain_iqr_s * 1e3:.3f} ms)" in text
    assert f"(IQR {timing.fused_iqr_s * 1e3:.3f} ms)" in text


def test_a_fused_build_that_fails_is_reported_not_hidden(monkeypatch):
    real = torch.optim.AdamW

    def adamw(params, fused=None, **kwargs):
        if fused:
            raise RuntimeError("no fused kernel here")
        return real(params, **kwargs)

    monkeypatch.setattr(adamw_timing.torch.optim, "AdamW", adamw)
    timing = time_adamw(model(), "cpu", rounds=2, seconds=0.001)
    assert timing.fused_s is None and timing.ratio is None and timing.plain_s > 0
    assert "RuntimeError: no fused kernel here" in timing.fused_error
    assert "could not be built" in timing.summary()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "mlp"}, "model has type str"),
        ({"rounds": 0}, "rounds"),
        ({"seconds": -1.0}, "seconds"),
        ({"config": {"lr": 1}}, "config has type dict"),
    ],
)
def test_bad_input_names_the_field(kwargs, message):
    args = {"model": model(), "device": "cpu", **kwargs}
    with pytest.raises(ValueError, match=message):
        time_adamw(**args)


def test_a_model_without_trainable_parameters_is_refused():
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        time_adamw(frozen, "cpu")
