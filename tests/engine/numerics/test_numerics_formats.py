"""Format facts and cast counts, checked on hand-made tensors at the format boundaries."""

from __future__ import annotations

import math

import pytest
import torch

from precision_nb.engine.numerics.formats import (
    COUNT_FIELDS,
    FORMATS,
    cast_counts,
    counts_row,
    format_name,
    overflow_behaviour,
)

NAN, INF = float("nan"), float("inf")


def counts(values, name, scale=None):
    x = torch.tensor(values, dtype=torch.float32)
    return dict(zip(COUNT_FIELDS, cast_counts(x, name, scale).tolist(), strict=True))


def test_format_limits_come_from_torch_finfo():
    expected = {
        "fp16": (65504.0, 2.0**-14, 2.0**-24),
        "bf16": (torch.finfo(torch.bfloat16).max, 2.0**-126, 2.0**-133),
        "fp8_e4m3": (448.0, 2.0**-6, 2.0**-9),
        "fp8_e5m2": (57344.0, 2.0**-14, 2.0**-16),
    }
    for name, (mx, normal, sub) in expected.items():
        info = FORMATS[name]
        assert (info.max, info.smallest_normal, info.smallest_subnormal) == (mx, normal, sub)
    assert not FORMATS["fp8_e4m3"].has_inf and FORMATS["fp8_e5m2"].has_inf


def test_fp16_boundaries_round_exactly_as_a_cast():
    values = [
        65504.0,  # max: kept
        65519.0,  # rounds down to 65504
        65520.0,  # the midpoint: ties to even -> inf
        1e6,  # inf
        2.0**-14,  # smallest normal
        2.0**-14 - 2.0**-25,  # midpoint below it: rounds up into the normal range
        2.0**-24,  # smallest subnormal
        2.0**-25 * (1 + 2.0**-20),  # just above half of it: rounds up to 2^-24
        2.0**-25,  # exactly half: ties to even -> 0
        2.0**-26,  # flushes to zero
        0.0,
        -0.0,
        NAN,
        INF,
    ]
    got = counts(values, "fp16")
    assert got == dict(zeros=2, nonfinite=2, underflow=2, subnormal=2, overflow=2)
    assert counts([-v for v in values], "fp16") == got  # symmetric in sign


def test_fp16_at_a_loss_scale():
    # 2^-30 * 2^10 = 2^-20 (subnormal, no longer lost); 64 * 2^10 = 65536 -> inf
    assert counts([2.0**-30, 64.0, 1.0], "fp16", 2.0**10) == dict(
        zeros=0, nonfinite=0, underflow=0, subnormal=1, overflow=1
    )
    assert counts([2.0**-30, 64.0, 1.0], "fp16")["underflow"] == 1


def test_bf16_smallest_normal_and_its_subnormals():
    values = [
        2.0**-126,  # smallest normal
        2.0**-127,  # subnormal
        2.0**-133,  # smallest subnormal
        2.0**-134 + 2.0**-149,  # just above half of it: rounds up
        2.0**-134,  # exactly half: ties to even -> 0
        torch.finfo(torch.float32).max,  # beyond bf16 max after rounding -> inf
        torch.finfo(torch.bfloat16).max,
    ]
    assert counts(values, "bf16") == dict(
        zeros=0, nonfinite=0, underflow=1, subnormal=3, overflow=1
    )


def test_e4m3_max_448_and_what_its_cast_does_beyond():
    values = [448.0, 464.0, 465.0, 480.0, 1e4, 2.0**-6, 2.0**-9, 2.0**-10, 2.0**-10 * 1.01]
    # 464 ties to even (448); 465, 480 and 1e4 lie beyond the range (no inf in e4m3fn)
    assert counts(values, "fp8_e4m3") == dict(
        zeros=0, nonfinite=0, underflow=1, subnormal=2, overflow=3
    )
    behaviour = overflow_behaviour("fp8_e4m3")
    cast = torch.tensor([1e4]).to(torch.float8_e4m3fn).float()[0].item()
    assert behaviour == ("nan" if math.isnan(cast) else "saturates")
    assert overflow_behaviour("fp16") == "inf" and overflow_behaviour("e5m2") == "inf"


def test_e5m2_max_57344():
    values = [57344.0, 61439.0, 61440.0, 2.0**-14, 2.0**-16, 2.0**-17, 2.0**-17 * 1.01]
    assert counts(values, "fp8_e5m2") == dict(
        zeros=0, nonfinite=0, underflow=1, subnormal=2, overflow=1
    )


def test_counts_row_gives_fractions_of_the_live_elements():
    row = counts_row([2, 1, 1, 0, 3], 10)
    assert row["live"] == 7 and row["zero_fraction"] == 0.2
    assert row["underflow_fraction"] == 1 / 7 and row["overflow_fraction"] == 3 / 7
    empty = counts_row([4, 0, 0, 0, 0], 4)
    assert empty["live"] == 0 and empty["underflow_fraction"] is None


def test_format_names_and_aliases():
    assert format_name("float8_e4m3fn") == "fp8_e4m3" and format_name(" BF16 ") == "bf16"
    assert format_name(torch.float16) == "fp16" and format_name("torch.float8_e5m2") == "fp8_e5m2"
    with pytest.raises(ValueError, match=r"formats: invalid value 'fp4'.*'fp16'"):
        format_name("fp4")
    with pytest.raises(ValueError, match="formats"):
        format_name(torch.float32)
