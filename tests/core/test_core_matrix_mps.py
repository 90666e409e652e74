"""MPS stays fp32 by this project's resolution rule, and the text says so: torch
itself has autocast for MPS, so "MPS runs fp32" would read as a limit it is not."""

from __future__ import annotations

import torch

from precision_nb.core.matrix import MPS_RULE
from precision_nb.core.resolution import explain_precision


def test_the_mps_fallback_names_the_project_s_rule_and_torch_s_mps_autocast():
    assert torch.amp.is_autocast_available("mps")  # what the reason says of torch
    for mode in ("auto", "bf16", "fp16"):
        e = explain_precision(mode, "mps", capabilities="mps")
        assert e.plan.mode == "fp32"
        mode_decision = next(d for d in e.decisions if d.field == "mode")
        assert MPS_RULE in mode_decision.reason and "MPS runs fp32" not in str(e), mode
    assert "this project's resolution rule" in MPS_RULE and "torch itself has autocast" in MPS_RULE
