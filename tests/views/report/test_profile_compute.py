"""profile() computes each plan's inspection and the numerics after the timed steps."""

from __future__ import annotations

import pytest

from precision_nb.views.report.profile import profile


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    result = profile(
        "mlp",
        preset="tiny",
        compare=("fp32", "fp16"),
        device="cpu",
        steps=2,
        rounds=1,
        loss_scale_lab=True,
        progress=False,
        out=out,
    )
    return result, out


def test_profile_carries_an_inspection_per_plan(lab):
    result, _ = lab
    labels = list(result.comparison.results)
    assert list(result.inspections) == labels
    for label, data in result.inspections.items():
        plan = result.comparison.results[label].plan
        assert data.plan == plan
        assert result.comparison.outcomes[label].inspection is data  # on the typed result too
        params = [r for r in data.memory if r["kind"] == "parameters"]
        assert sum(r["bytes"] for r in params) == sum(r["expected_bytes"] for r in params) > 0
    assert result.settings["inspection (after the timed steps)"].endswith(" s")


def test_numerics_overlays_the_scaled_plans_history(lab):
    result, out = lab
    scaled = [r for r in result.comparison.results.values() if r.plan.use_scaler]
    assert len(scaled) == 1 and scaled[0].scale_history
    assert result.numerics.run is scaled[0]
    run = result.numerics.window["run"]
    assert run["attempts"] == len(scaled[0].scale_history)
    last = scaled[0].scale_history[-1]["loss_scale"]
    assert result.numerics.info["scale"] == last
    text = (out / "report.html").read_text(encoding="utf-8")
    assert f"The scale history of the {scaled[0].label} plan is drawn over the window." in text
    assert result.numerics.window_text() in text.replace("&#x27;", "'")


def test_notebook_view_shows_the_inspection_and_the_window(lab):
    result, _ = lab
    page = result._repr_html_()
    assert "Memory by kind and dtype; op dtypes" in page
    assert "<b>Numerics</b>" in page and "Safe fp16 loss scales" in page


def test_a_section_that_fails_is_left_out_with_an_event(monkeypatch):
    from precision_nb.engine import analyses

    def boom(source, device, run):
        raise RuntimeError("out of memory in the instrumented step")

    monkeypatch.setattr(analyses, "analyse_numerics", boom)
    result = profile(
        "mlp", preset="tiny", compare="fp32", device="cpu", steps=1, rounds=1, progress=False,
        inspect=False,
    )  # fmt: skip
    assert result.numerics is None and not result.inspections
    events = [e for e in result.comparison.events if e.kind == "warning"]
    assert events[-1].data == {"section": "numerics"}
    assert "out of memory in the instrumented step" in events[-1].message


def test_inspect_and_numerics_must_be_booleans():
    with pytest.raises(ValueError, match="numerics: invalid value 'no'"):
        profile("mlp", preset="tiny", numerics="no", progress=False)
