"""Block-scaled casts: torchao's values bit for bit, hand arithmetic on crafted blocks, padding,
sampled statistics whose intervals cover the exact value, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

pytest.importorskip("torchao", reason="the test extra installs torchao (the blocks extra)")

from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402
from torchao.prototype.mx_formats.mx_tensor import MXTensor  # noqa: E402
from torchao.prototype.mx_formats.nvfp4_tensor import (  # noqa: E402
    NVFP4Tensor,
    per_tensor_amax_to_scale,
)

from precision_nb.engine.numerics import block_stats as S  # noqa: E402
from precision_nb.engine.numerics import blocks as B  # noqa: E402
from precision_nb.engine.numerics.analysis import analyze  # noqa: E402

FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4")
MODES = {"rceil": ScaleCalculationMode.RCEIL, "floor": ScaleCalculationMode.FLOOR}


def torchao_back(x: torch.Tensor, name: str, mode: str = "rceil") -> torch.Tensor:
    """torchao's own cast and dequantisation, called here as its docs show."""
    fmt = B.BLOCK_FORMATS[name]
    if fmt.family == "mx":
        mx = MXTensor.to_mx(x, fmt.dtype, block_size=fmt.block, scaling_mode=MODES[mode])
        return mx.dequantize(torch.float32)
    scale = per_tensor_amax_to_scale(x.abs().amax())
    return NVFP4Tensor.to_nvfp4(x, per_tensor_scale=scale).dequantize(torch.float32)


def _rel(back: torch.Tensor, x: torch.Tensor) -> float:
    return float((back.double() - x.double()).norm() / x.double().norm())


def stats(x: torch.Tensor, name: str, mode: str = "rceil") -> dict:
    return S.estimate(S.block_stats(x, name, mode).tolist())


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("mode", ["rceil", "floor"])
def test_statistics_are_those_of_torchaos_cast_bit_for_bit(name, mode, monkeypatch):
    monkeypatch.setattr(S, "SAMPLE_ELEMENTS", 2**20)  # every row cast: exact values
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(128, 256, generator=gen) * torch.logspace(-6, 3, 256)  # blocks of all sizes
    x[3, :40] = 0.0  # structural zeros: not live, never underflow
    back = torchao_back(x, name, mode)
    mine, _scales = B.cast_back(x, name, mode)
    assert torch.equal(mine, back)
    got = stats(x, name, mode)
    live = x != 0
    assert got["rel_error"] == pytest.approx(_rel(back, x), rel=1e-12)
    lost = int((live & (back == 0)).sum())
    assert got["underflow_fraction"] == pytest.approx(lost / int(live.sum()), abs=0)
    assert got["rows_cast"] == got["rows"]  # every row cast: exact, the interval is the value
    assert got["rel_error_low"] == got["rel_error"] == got["rel_error_high"]


def _block(values: list[float], size: int) -> torch.Tensor:
    return torch.tensor(values + [0.0] * (size - len(values)), dtype=torch.float32).reshape(1, -1)


# (format, element max, values exactly on the element grid, a value just beyond the max,
#  its RCEIL result and its FLOOR result, all in units of 2^k)
GRIDS = {
    "mxfp8_e4m3": (448.0, [448.0, 240.0, 1.0, 0.5, 2.0**-6, 2.0**-9], 500.0, 512.0, 448.0),
    # 60000 / 2 = 30000 lies between 28672 and 32768 on the e5m2 grid: nearer 28672
    "mxfp8_e5m2": (57344.0, [57344.0, 1.0, 0.5, 2.0**-14, 2.0**-16], 60000.0, 57344.0, 57344.0),
    "mxfp4": (6.0, [6.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.5], 7.0, 8.0, 6.0),
}


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4"])
@pytest.mark.parametrize("k", [-30, 0, 12])
def test_a_block_whose_max_is_the_element_max_times_2_to_the_k_is_exact(name, k):
    top, grid, beyond, rceil, floor = GRIDS[name]
    x = _block([v * 2.0**k for v in grid], 32)
    for mode in ("rceil", "floor"):  # both give the scale 2^k: every element is on the grid
        back, scales = B.cast_back(x, name, mode)
        assert torch.equal(back, x) and float(scales[0, 0]) == 2.0**k
        got = stats(x, name, mode)
        assert got["rel_error"] == 0 and got["saturated_fraction"] == 0
    # just beyond: RCEIL doubles the scale and rounds the value on the element grid, FLOOR keeps
    # 2^k and clamps the value to the element max: saturated
    y = _block([beyond * 2.0**k, 2.0**k], 32)
    assert float(B.cast_back(y, name, "rceil")[0][0, 0]) == rceil * 2.0**k
    assert float(B.cast_back(y, name, "floor")[0][0, 0]) == floor * 2.0**k
    assert stats(y, name, "rceil")["saturated_fraction"] == 0
    assert stats(y, name, "floor")["saturated_fraction"] == pytest.approx(1 / 2)


def _nvfp4_scale(amax: float, block_amax: float) -> float:
    """NVFP4's two-level scale by hand in fp32: per-tensor amax / (448 * 6), the block's
    amax / 6 over it rounded to e4m3 (exact here), their product."""
    f32 = torch.float32
    per_tensor = torch.tensor(amax, dtype=f32) / torch.tensor(448.0 * 6.0, dtype=f32)
    block = (torch.tensor(block_amax / 6.0, dtype=f32) / per_tensor).to(torch.float8_e4m3fn)
    return float(per_tensor * block.to(f32))


def test_nvfp4_two_level_scale_by_hand():
    grid = [6.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.5, 0.0]
    k = -7
    first = [v * 2.0**k for v in grid] + [0.0] * 8
    second = [v * 2.0 ** (k - 3) for v in grid] + [0.0] * 8  # block scale 448 / 8 = 56: an e4m3
    x = torch.tensor([first + second], dtype=torch.float32)
    back, scales = B.cast_back(x, "nvfp4")
    s1, s2 = _nvfp4_scale(6 * 2.0**k, 6 * 2.0**k), _nvfp4_scale(6 * 2.0**k, 6 * 2.0 ** (k - 3))
    assert [float(v) for v in scales[0]] == [s1, s2]
    expected = torch.tensor([[v * s1 / 2.0**k for v in first] + [v * s2 / 2.0 ** (k - 3)
                                                                   for v in second]])  # fmt: skip
    assert torch.equal(back, expected.float())
    assert torch.equal(back, torchao_back(x, "nvfp4"))


# a block of element-format subnormals (units of the block scale): the value, what the cast
# gives (round to nearest, ties to even), and whether it underflows
SUBNORMALS = {
    "mxfp8_e4m3": (448.0, [(2.0**-7, 2.0**-7), (3 * 2.0**-10, 2.0**-8), (2.0**-10, 0.0),
                           (2.0**-11, 0.0)]),
    "mxfp8_e5m2": (57344.0, [(2.0**-15, 2.0**-15), (3 * 2.0**-17, 2.0**-15), (2.0**-17, 0.0),
                             (2.0**-18, 0.0)]),
    "mxfp4": (6.0, [(0.5, 0.5), (0.75, 1.0), (0.25, 0.0), (0.2, 0.0)]),
}  # fmt: skip


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4"])
def test_a_block_of_subnormals_rounds_to_the_subnormal_grid(name):
    top, cases = SUBNORMALS[name]
    k = 3
    x = _block([top * 2.0**k] + [v * 2.0**k for v, _ in cases], 32)
    back, _ = B.cast_back(x, name)
    assert [float(v) for v in back[0, 1 : 1 + len(cases)]] == [e * 2.0**k for _, e in cases]
    got = stats(x, name)
    lost = sum(1 for _, e in cases if e == 0.0)
    assert got["underflow_fraction"] == pytest.approx(lost / (1 + len(cases)))


def test_nvfp4_subnormal_block_by_hand():
    # the scale is 1 within an fp32 rounding: 0.8 -> 1.0, 0.3 -> 0.5 (above the midpoint
    # 0.25), 0.2 -> 0 (below it): e2m1's one subnormal is 0.5
    x = torch.tensor([[6.0, 0.5, 0.8, 0.3, 0.2] + [0.0] * 11], dtype=torch.float32)
    back, scales = B.cast_back(x, "nvfp4")
    s = float(scales[0, 0])
    assert s == _nvfp4_scale(6.0, 6.0)
    assert [float(v) for v in back[0, :5]] == [6 * s, 0.5 * s, 1.0 * s, 0.5 * s, 0.0]
    assert stats(x, "nvfp4")["underflow_fraction"] == pytest.approx(1 / 5)


# one outlier: its block's scale sends the small values below half the smallest subnormal
OUTLIERS = {"mxfp8_e4m3": 2.0**20, "mxfp8_e5m2": 2.0**40, "mxfp4": 16.0, "nvfp4": 32.0}


@pytest.mark.parametrize("name", FORMATS)
def test_one_outlier_flushes_its_own_block_only(name):
    size = B.BLOCK_FORMATS[name].block
    outlier = OUTLIERS[name]
    x = torch.ones(1, 2 * size)
    x[0, 0] = outlier
    back, scales = B.cast_back(x, name)
    if name != "nvfp4":  # power-of-two scale: 2^ceil(log2(outlier / element max))
        top = B.BLOCK_FORMATS[name].element_max
        assert float(scales[0, 0]) == 2.0 ** math.ceil(math.log2(outlier / top))
        assert float(scales[0, 1]) == 2.0 ** math.ceil(math.log2(1 / top))
    assert float(back[0, 0]) == pytest.approx(outlier, rel=2**-20)
    assert torch.equal(back[0, 1:size], torch.zeros(size - 1))  # the outlier's block: flushed
    assert torch.allclose(back[0, size:], torch.ones(size), rtol=2**-20)  # the next: kept
    assert stats(x, name)["underflow_fraction"] == pytest.approx((size - 1) / (2 * size))


def test_a_last_dimension_off_the_block_is_padded_and_said_so():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, 40, generator=gen)  # 40 = 32 + 8: the second block is padded with 24 zeros
    for name in FORMATS:
        got = stats(x, name)
        block = B.BLOCK_FORMATS[name].block
        assert got["padded"] == 6 * ((-40) % block) and got["elements"] == 240
        padded = torch.nn.functional.pad(x, (0, (-40) % block))
        back = torchao_back(padded, name)[:, :40]
        assert got["rel_error"] == pytest.approx(_rel(back, x), rel=1e-12)


def test_sampled_rows_are_cast_as_in_the_whole_tensor(monkeypatch):
    monkeypatch.setattr(S, "SAMPLE_ELEMENTS", 2048)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(256, 64, generator=gen) * torch.rand(256, 1, generator=gen) * 10
    uniform, certain, drawn = S.sample_rows(x, x.double().square().sum(1))
    assert len(uniform) == len(drawn) == 16 and len(set(uniform.tolist())) == 16
    pick = torch.unique(torch.cat([uniform, certain, drawn]))
    for name in FORMATS:
        whole = torchao_back(x, name)
        amax = x.abs().amax() if name == "nvfp4" else None
        part, _ = B.cast_back(x.index_select(0, pick).contiguous(), name, amax=amax)
        assert torch.equal(part, whole.index_select(0, pick))
        got = stats(x, name)
        assert got["rows_cast"] == len(pick) and got["rows"] == 256
        assert got["rel_error_low"] < got["rel_error"] < got["rel_error_high"]


def test_sampled_intervals_cover_the_exact_value_about_95_percent_of_the_time(monkeypatch):
    """200 matrices whose rows differ in scale by orders of magnitude, each with one large
    element (so a few small ones underflow: a rare event); a quarter of the rows are cast; the
    95 % intervals of the relative error and of the underflow fraction must cover the exact
    (all-row) values about 95 % of the time."""
    monkeypatch.setattr(S, "SAMPLE_ELEMENTS", 64 * 64)
    gen = torch.Generator().manual_seed(4)
    covered = {"rel_error": 0, "underflow": 0}
    trials = 200
    for _ in range(trials):
        scale = torch.exp(torch.randn(256, 1, generator=gen) * 2)
        x = torch.randn(256, 64, generator=gen) * scale
        x = x * (torch.rand(256, 64, generator=gen) > 0.2)  # some zeros
        x[:, 0] = 3000.0 * scale[:, 0]  # a large element per row: small ones underflow
        back = torchao_back(x, "mxfp8_e4m3")
        live = x != 0
        exact = {
            "rel_error": _rel(back, x),
            "underflow": float((live & (back == 0)).sum() / live.sum()),
        }
        got = stats(x, "mxfp8_e4m3")
        assert got["rows_cast"] < 256
        for key in covered:
            covered[key] += got[f"{key}_low"] <= exact[key] <= got[f"{key}_high"]
    for key, hits in covered.items():
        assert 0.90 <= hits / trials <= 0.995, (key, hits)


def test_unknown_format_lists_every_allowed_one_with_aliases():
    with pytest.raises(ValueError) as err:
        B.resolve_formats(["mxfp6"])
    text = str(err.value)
    assert "formats: invalid value 'mxfp6'" in text
    for name in ("fp16", "fp8_e4m3", *FORMATS, "mxfp8", "nv_fp4", "float8_e4m3fn"):
        assert repr(name) in text or name in text
    assert B.resolve_formats(["MXFP8", "nvfp4", torch.float16, "e5m2"]) == (
        ["fp16", "fp8_e5m2"],
        ["mxfp8_e4m3", "nvfp4"],
    )


def test_torchao_missing_names_the_extra_before_anything_runs(monkeypatch):
    monkeypatch.setattr(B, "_import", lambda: (None, "ModuleNotFoundError: No module named 'x'"))
    model = nn.Linear(4, 2)
    with pytest.raises(ImportError, match=r"extra 'blocks'.*precision-nb\[blocks\]"):
        analyze(model, [(torch.randn(2, 4), torch.tensor([0, 1]))], formats=["mxfp4"])
    analyze(model, [(torch.randn(2, 4), torch.tensor([0, 1]))], formats=["bf16"])  # no torchao


def test_torchao_import_output_is_recorded_not_printed(capfd):
    notes = B.torchao_notes()  # imported (and cached) by now: what it said is kept
    out, err = capfd.readouterr()
    assert "Failed to load" not in out + err
    assert isinstance(notes, list) and all(isinstance(n, str) for n in notes)


def test_operands_cast_together_give_what_each_gives_alone():
    """Operands with the same number of columns share one torchao call per format (MX: rows
    stacked; NVFP4: per-expert scales); every value is what the operand gives on its own."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(48, 40, generator=gen) * 100  # padded to 64 (MX) / 48 (NVFP4)
    b = torch.randn(7, 40, generator=gen) * 1e-3  # another amax: NVFP4's per-tensor scale differs
    c = torch.randn(5, 24, generator=gen)  # other columns: cast on its own
    together = S.block_stats_many([a, b, c], FORMATS)
    for x, got in zip((a, b, c), together, strict=True):
        alone = torch.stack([S.block_stats(x, name) for name in FORMATS])
        assert torch.equal(got, alone)


def test_block_cast_keeps_the_shape_and_refuses_bad_input():
    import precision_nb as pnb

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 40, generator=gen)  # rows 2 x 3, blocks along the last dimension
    back, scales = pnb.block_cast(x, "MXFP8")
    padded = torch.nn.functional.pad(x.reshape(6, 40), (0, 24))
    assert torch.equal(back, torchao_back(padded, "mxfp8_e4m3")[:, :40].reshape(2, 3, 40))
    assert scales.shape == (6, 2)
    floor, _ = pnb.block_cast(x, "mxfp8_e4m3", scale_mode="floor")
    assert torch.equal(floor.reshape(6, 40), torchao_back(padded, "mxfp8_e4m3", "floor")[:, :40])
    with pytest.raises(ValueError, match=r"fmt: invalid value 'fp8_e4m3'; allowed: 'mxfp8_e4m3'"):
        pnb.block_cast(x, "fp8_e4m3")
    with pytest.raises(ValueError, match="scale_mode: invalid value 'even'; allowed: 'rceil'"):
        pnb.block_cast(x, "mxfp4", scale_mode="even")
    with pytest.raises(ValueError, match="x: invalid value of type list"):
        pnb.block_cast([1.0, 2.0], "nvfp4")
