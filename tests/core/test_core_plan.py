"""PrecisionConfig / PrecisionPlan: spellings accepted, bad input rejected with a clear message."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from precision_nb import PrecisionConfig, PrecisionPlan


@pytest.mark.parametrize(
    "typed,canonical",
    [
        ("auto", "auto"),
        (" AUTO ", "auto"),
        ("BF16", "bf16"),
        ("  fp16\n", "fp16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("bfloat16", "bf16"),
        ("float32", "fp32"),
        ("torch.bfloat16", "bf16"),
        (torch.float16, "fp16"),
        (torch.bfloat16, "bf16"),
        (torch.float32, "fp32"),
    ],
)
def test_mode_spellings(typed, canonical):
    assert PrecisionConfig(mode=typed).mode == canonical


@pytest.mark.parametrize("typed,canonical", [("Float16", "fp16"), (torch.bfloat16, "bf16")])
def test_dtype_spellings(typed, canonical):
    assert PrecisionConfig(dtype=typed).dtype == canonical


@pytest.mark.parametrize("bad", ["fp8", "half precision", 16, "", None, torch.int8, 1.5, True])
def test_bad_mode_names_field_value_and_allowed(bad):
    with pytest.raises(ValueError) as err:
        PrecisionConfig(mode=bad)
    message = str(err.value)
    assert "precision.mode" in message
    assert repr(bad) in message
    assert "'fp16'" in message and "'auto'" in message


@pytest.mark.parametrize("bad", ["auto", "fp8", 16])
def test_bad_dtype_names_field(bad):
    with pytest.raises(ValueError, match=r"precision\.dtype") as err:
        PrecisionConfig(dtype=bad)
    assert "'auto'" not in str(err.value).split("allowed:")[1]


def test_loss_scale_lab_must_be_a_bool():
    with pytest.raises(ValueError, match="loss_scale_lab"):
        PrecisionConfig(loss_scale_lab="yes")


def test_requested_applies_the_dtype_rule():
    assert PrecisionConfig("auto", "fp16").requested == "fp16"
    assert PrecisionConfig("fp32", "bf16").requested == "fp32"
    assert PrecisionConfig().requested == "auto"


def test_plan_is_frozen_and_reports_mixed_precision():
    plan = PrecisionPlan("bf16", torch.bfloat16, False, True, "cuda")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.mode = "fp32"  # type: ignore[misc]
    assert plan.is_mixed_precision
    assert PrecisionPlan("fp16", torch.float16, True, True, "cuda").is_mixed_precision
    assert not PrecisionPlan("fp32", torch.float32, False, False, "cpu").is_mixed_precision


def test_plan_dict_round_trip():
    plan = PrecisionPlan("fp16", torch.float16, True, True, "cuda")
    data = plan.to_dict()
    assert data["dtype"] == "torch.float16"
    assert PrecisionPlan.from_dict(data) == plan
