"""The fp8 what-if says which of its casts the fp8 training recipes make: weights and activations
in e4m3, activation gradients in e5m2, weight gradients in neither (the weight-gradient GEMM of
torchao.float8 and Transformer Engine writes them in high precision)."""

from __future__ import annotations

from precision_nb.engine.numerics import fp8
from precision_nb.engine.numerics.analysis import analyze
from precision_nb.views.report.numerics import Numerics


def test_every_fp8_row_names_its_place_in_the_recipes():
    result = analyze("mlp", preset="tiny", formats=("fp8_e4m3", "fp8_e5m2"), device="cpu")
    roles = {(r["tensor"], r["format"]): r["recipe"] for r in result.fp8}
    assert roles == {
        ("weight", "fp8_e4m3"): fp8.RECIPE,
        ("weight", "fp8_e5m2"): fp8.OTHER_FORMAT,
        ("weight_grad", "fp8_e4m3"): fp8.OUTSIDE,
        ("weight_grad", "fp8_e5m2"): fp8.OUTSIDE,
        ("activation", "fp8_e4m3"): fp8.RECIPE,
        ("activation", "fp8_e5m2"): fp8.OTHER_FORMAT,
        ("activation_grad", "fp8_e4m3"): fp8.OTHER_FORMAT,
        ("activation_grad", "fp8_e5m2"): fp8.RECIPE,
    }
    html = Numerics(result)._repr_html_()
    assert "outside the recipes (kept in high precision)" in html
