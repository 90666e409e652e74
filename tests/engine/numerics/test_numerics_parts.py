"""Scale sweep, in-training stats, fp8 scaled error and update stagnation, tensor by tensor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from precision_nb.engine.numerics.formats import cast_counts, normal_limit
from precision_nb.engine.numerics.fp8 import hardware_note, relative_error, scaled_error
from precision_nb.engine.numerics.scale_window import (
    SCALE_EXPONENTS,
    SweepTotal,
    cast_limits,
    history_vs_window,
    subnormal_error_sums,
    sweep_counts,
    sweep_rows,
    window,
)
from precision_nb.engine.numerics.stagnation import lost_updates
from precision_nb.engine.numerics.training import STAT_KEYS, grad_underflow_stats

PACKAGE = str(Path(__import__("precision_nb").__file__).parent)


def boundary_tensor() -> torch.Tensor:
    u, o = cast_limits("fp16")
    n = normal_limit("fp16")
    edges = []
    for k in SCALE_EXPONENTS:
        for v in (u * 2.0**-k, n * 2.0**-k, o * 2.0**-k):
            t = torch.tensor([v])
            edges += [t, torch.nextafter(t, torch.zeros(1)), torch.nextafter(t, t * 2)]
    gen = torch.Generator().manual_seed(0)
    spread = torch.exp2(torch.empty(4000).uniform_(-60, 20, generator=gen))
    signs = torch.where(torch.rand(4000, generator=gen) < 0.5, -1.0, 1.0)
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf")])
    return torch.cat([*edges, spread * signs, special])


def test_fp16_cast_limits_are_the_documented_boundaries():
    assert cast_limits("fp16") == (2.0**-25, 65520.0)
    # 2^-14 - 2^-25 lies halfway between the largest subnormal and 2^-14: ties to even round up
    assert normal_limit("fp16") == 2.0**-14 - 2.0**-25


def test_sweep_matches_a_real_cast_at_every_scale():
    x = boundary_tensor()
    got = sweep_counts(x).tolist()
    for i, k in enumerate(SCALE_EXPONENTS):
        c = cast_counts(x, "fp16", 2.0**k).tolist()
        assert got[i] == [c[2], c[3], c[4]], k  # underflow, subnormal, overflow


def test_subnormal_error_is_the_mean_relative_error_of_real_casts():
    x = boundary_tensor()
    sums = subnormal_error_sums(x).tolist()
    counts = sweep_counts(x).tolist()
    finite = x[torch.isfinite(x) & (x != 0)].abs()
    for i, k in enumerate(SCALE_EXPONENTS):
        v = finite * 2.0**k
        back = v.half().float()
        sub = (back != 0) & (back < 2.0**-14)
        assert int(sub.sum()) == counts[i][1], k
        expected = ((back - v).abs() / v)[sub].double().sum().item()
        assert sums[i] == pytest.approx(expected, rel=1e-6, abs=1e-12), k
    # a value 1.5 x the smallest subnormal rounds to 2 x (ties to even): relative error 1/3
    one = subnormal_error_sums(torch.tensor([1.5 * 2.0**-24]), [0]).tolist()
    assert one == [pytest.approx(1 / 3)]


def _total(counts, live, errors=None):
    total = SweepTotal(live=live, tensors=1)
    total.counts = [list(c) for c in counts]
    total.errors = list(errors or [0.0] * len(counts))
    return total


def test_sweep_rows_and_window():
    # underflow falls with the scale, subnormals with it, overflow appears at 2^20
    p = [[max(0, 100 - 10 * k), max(0, 500 - 25 * k), 0 if k < 20 else 5] for k in SCALE_EXPONENTS]
    errors = [0.01 * s for _, s, _ in p]  # mean relative error 1 % among the subnormals
    a = [[0, 0, 0] for _ in SCALE_EXPONENTS]
    rows = sweep_rows(_total(p, 1000, errors), _total(a, 0), threshold=0.01)
    assert [r["in_window"] for r in rows].index(True) == 9  # 10/1000 <= 0.01 from k = 9
    win = window(rows, 0.01)
    assert (win["lo"], win["hi"]) == (9, 19)
    assert win["lo_subnormal_fraction"] == pytest.approx(275 / 1000)
    assert win["lo_subnormal_rel_error"] == pytest.approx(0.01)
    assert win["hi_subnormal_fraction"] == pytest.approx(25 / 1000)
    assert rows[0]["activation_underflow_fraction"] is None
    assert rows[20]["subnormal_fraction"] == 0 and rows[20]["subnormal_rel_error"] is None
    hist = [{"loss_scale": s} for s in (2.0**8, 2.0**9, 2.0**16, 2.0**21, None)]
    assert history_vs_window(hist, win) == dict(attempts=4, below=1, inside=2, above=1)
    early = [[u, s, 0 if k < 5 else 5] for k, (u, s, _) in enumerate(p)]  # overflow first
    empty = window(sweep_rows(_total(early, 1000), _total(a, 0), threshold=0.01), 0.01)
    assert empty["lo"] is None and "every scale" in empty["reason"]
    assert "lo_subnormal_fraction" not in empty
    high = window(sweep_rows(_total(p, 1000), _total(a, 0), threshold=0.001), 0.001)
    assert high["lo"] == 10  # a stricter threshold moves the lower edge up
    # underflow above the threshold at every scale: the reason gives the threshold as the
    # window's text does (0.1 %), never as the bare fraction (0.001)
    flat = [[100, 0, 0] for _ in SCALE_EXPONENTS]
    never = window(sweep_rows(_total(flat, 1000), _total(a, 0), threshold=0.001), 0.001)
    assert never["lo"] is None and "underflow stays above 0.1 % of the non-zero" in never["reason"]
    assert "0.001" not in never["reason"]


def test_sweep_rows_count_the_window_over_their_groups_and_show_every_gradient_apart():
    held = [[10, 0, 0] for _ in SCALE_EXPONENTS]
    kept_fp32 = [[400, 0, 0] for _ in SCALE_EXPONENTS]  # a tensor a real fp16 run keeps fp32
    every = _total(held, 1000) + _total(kept_fp32, 1000)
    rows = sweep_rows(_total(held, 1000), _total([[0, 0, 0]] * 25, 0), 0.01, every=every)
    assert rows[0]["underflow_fraction"] == 0.01 and rows[0]["in_window"]
    assert rows[0]["all_underflow_fraction"] == pytest.approx(410 / 2000)


def test_grad_underflow_stats_match_cast_counts():
    gen = torch.Generator().manual_seed(1)
    grads = [
        torch.exp2(torch.empty(300).uniform_(-40, 0, generator=gen)),
        None,
        torch.exp2(torch.empty(200).uniform_(-30, 10, generator=gen)),
        torch.zeros(10),
    ]
    scale = torch.tensor([2.0**10])
    stats = grad_underflow_stats(grads, scale)
    assert set(stats) == set(STAT_KEYS)
    per = [cast_counts(g, "fp16", 2.0**10).tolist() for g in (grads[0], grads[2])]
    live = [300, 200]
    assert stats["underflow"].item() == pytest.approx((per[0][2] + per[1][2]) / 500)
    fracs = [per[i][2] / live[i] for i in range(2)]
    assert stats["worst_underflow"].item() == pytest.approx(max(fracs))
    assert stats["worst_index"].item() == (0 if fracs[0] >= fracs[1] else 2)
    assert stats["overflow"].item() == pytest.approx((per[0][4] + per[1][4]) / 500)
    # already-scaled gradients with scale None read the same
    scaled = [None if g is None else g * 2.0**10 for g in grads]
    assert grad_underflow_stats(scaled)["underflow"].item() == stats["underflow"].item()
    none = grad_underflow_stats([None, None])
    assert none["worst_index"].item() == -1 and none["underflow"].item() == 0


def test_grad_underflow_stats_make_no_host_transfer(monkeypatch):
    calls = []
    for name in ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=original, _name=name, **k):
            if sys._getframe(1).f_code.co_filename.startswith(PACKAGE):
                calls.append(_name)
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    cast_limits("fp16")  # cached limits (read once per process, not per call)
    grads = [torch.randn(50) * 1e-6, None, torch.randn(20)]
    grad_underflow_stats(grads, torch.tensor([65536.0]))
    assert calls == []
    cast_limits.__wrapped__("fp16")  # uncached: reads values, and the patch sees it
    assert calls


def test_fp8_scaled_error():
    # scaled by 448 / amax, these land exactly on e4m3 values: no error
    exact = torch.tensor([2.0, -1.0, 0.5, 0.0])
    err = scaled_error(exact, "fp8_e4m3").tolist()
    assert err[0] == 2.0 and relative_error(err) == 0.0 and err[3] == 0
    # 1e-9 * 448 / 1 lies below e4m3's smallest subnormal (2^-9): lost even with scaling
    tiny = scaled_error(torch.tensor([1.0, 1e-9, float("nan")]), "fp8_e4m3").tolist()
    assert tiny[3] == 1 and tiny[0] == 1.0
    x = torch.tensor([1.0, 1.1])  # 1.1 * 448 / 1.1 = 448 exact; 1 * 407.27 -> 416 (ulp 32)
    err = scaled_error(x, "fp8_e4m3").tolist()
    back = (416.0 / (448.0 / 1.1)) - 1.0
    assert relative_error(err) == pytest.approx(abs(back) / (1 + 1.1**2) ** 0.5, rel=1e-5)
    assert relative_error(scaled_error(torch.zeros(3), "fp8_e5m2").tolist()) is None


def test_lost_updates_are_what_the_cast_rounds_away():
    # just above a power of two the gap below is half the gap above: at 1.0 in bf16 the gap up
    # is 2^-7, down 2^-8, so 0.75 * 2^-8 is lost upwards and survives downwards
    old = torch.ones(2)
    step = 0.75 * 2.0**-8
    assert lost_updates(old, old + torch.tensor([step, -step]), "bf16").tolist() == [2, 1]
    up = lost_updates(old[:1], old[:1] + step, "bf16")
    assert up.tolist() == [1, 1]


def test_lost_updates_half_a_gap():
    old = torch.ones(4)
    new = old + torch.tensor([2.0**-9, 2.0**-7, 0.0, -(2.0**-12)])
    # bf16 ulp at 1 is 2^-7 (2^-8 below 1): 2^-9 and -2^-12 are lost; fp16 ulp 2^-10: none is
    assert lost_updates(old, new, "bf16").tolist() == [3, 2]
    assert lost_updates(old, new, "fp16").tolist() == [3, 1]  # -2^-12 < half of 2^-11


def test_hardware_note_names_the_presets_and_this_machine(fake_torch):
    fake_torch(cuda=False)
    note = hardware_note()
    assert note["min_compute_capability"] == "8.9" and note["this_machine"] is False
    assert any("cuda-fp8" in p and "9.0" in p for p in note["presets"])
    assert "simulation" in note["text"] and "8.9" in note["text"]


def test_fp8_cast_follows_torchao_float8_dynamic_tensorwise_recipe():
    # amax_to_scale: fp8_max / max(amax, 1e-12) in float64, rounded to fp32
    x = torch.tensor([3.0, -0.7, 1e-3])
    scale = torch.tensor(448.0 / 3.0, dtype=torch.float64).float()
    expected = (x.abs() * scale).clamp(max=448.0).to(torch.float8_e4m3fn).float() / scale
    err = scaled_error(x, "fp8_e4m3").tolist()
    direct = torch.linalg.vector_norm(expected - x.abs()).double().square().item()
    assert err[1] == pytest.approx(direct, rel=1e-12, abs=0)
    # a tensor whose amax is below the 1e-12 floor is scaled by 448 / 1e-12, not to 448
    below = scaled_error(torch.tensor([1e-13, 5e-14]), "fp8_e4m3").tolist()
    s = torch.tensor(448.0 / 1e-12, dtype=torch.float64).float()
    back = (torch.tensor([1e-13, 5e-14]) * s).to(torch.float8_e4m3fn).float() / s
    assert below[3] == 0 and below[1] == pytest.approx(
        torch.linalg.vector_norm(back - torch.tensor([1e-13, 5e-14])).double().square().item()
    )


def test_subnormal_error_of_a_large_tensor_is_estimated_from_a_strided_sample():
    gen = torch.Generator().manual_seed(3)
    x = torch.exp2(torch.empty(300_000).uniform_(-40, -10, generator=gen))
    exact = subnormal_error_sums(x, limit=None)
    sampled = subnormal_error_sums(x, limit=1 << 14)
    counts = sweep_counts(x)[:, 1].double()
    inside = counts > 1000
    mean_exact, mean_sampled = exact[inside] / counts[inside], sampled[inside] / counts[inside]
    assert torch.allclose(mean_sampled, mean_exact, rtol=0.05)
    assert not torch.equal(sampled, exact)  # it did sample
