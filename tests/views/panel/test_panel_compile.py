"""The panel's Compile control: resolved live with its reason, said in the header, refused with
the reason where this machine cannot compile. No model is compiled here."""

from __future__ import annotations

import html

import pytest

from precision_nb.views.panel import Panel


@pytest.fixture(scope="module")
def panel() -> Panel:
    made = Panel(steps=3, log_every=1, device="cpu")
    yield made
    made.close()


def test_the_compile_control_sits_in_the_plan_tab_and_starts_eager(panel: Panel) -> None:
    widget = panel.widgets.compile
    assert widget.value == "off"
    assert tuple(widget.options) == ("off", "default", "reduce-overhead", "max-autotune")
    assert "pnb-compile" in widget._dom_classes
    line = html.unescape(panel.widgets.headline.value)
    assert line.endswith("· eager") and "compile" not in panel.explanation.summary()


def test_choosing_a_mode_resolves_it_live_with_its_reason(panel: Panel) -> None:
    panel.set(mode="bf16", compile="reduce-overhead")
    try:
        assert panel.selection.compile == "reduce-overhead"
        decision = panel.explanation.decisions[-1]
        assert decision.field == "compile" and decision.fallback
        line = html.unescape(panel.widgets.headline.value)
        assert "compile reduce-overhead (inductor, CUDA graphs skipped)" in line
        assert "(fallback)" in line and "CUDA graphs record CUDA kernels only" in line  # hover
        assert "compile" in panel.widgets.plan_html.value
        assert 'torch.compile(model, mode="reduce-overhead")' in panel.widgets.code_area.value
        panel.widgets.compile.value = "default"  # the widget itself re-resolves too
        assert panel.explanation.compile.mode == "default"
        assert "compile default (inductor)" in html.unescape(panel.widgets.headline.value)
    finally:
        panel.set(compile="off", mode="auto")


def test_a_simulated_gpu_explains_cuda_graphs(panel: Panel) -> None:
    panel.set(device="cuda-bf16", compile="reduce-overhead")
    try:
        assert not panel.explanation.compile.fallback and panel.explanation.compile.simulated
        assert "recorded once and replayed" in panel.explanation.decisions[-1].reason
    finally:
        panel.set(device="cpu", compile="off")


def test_a_bad_compile_value_is_refused_by_name_and_shown(panel: Panel) -> None:
    with pytest.raises(ValueError, match="compile: invalid value 'fastest'"):
        panel.set(compile="fastest")
    assert "compile: invalid value 'fastest'" in (panel.error or "")
    assert panel.widgets.compile.value == "off"


def test_a_mode_this_machine_cannot_compile_is_shown_not_a_dead_widget(panel: Panel) -> None:
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"cpp.cxx": (None, "no-such-cxx-precision-nb")}):
        panel.widgets.compile.value = "default"
        try:
            assert panel.explanation is None
            assert "no C++ compiler was found" in (panel.error or "")
            assert "no C++ compiler was found" in panel.widgets.error_box.value
            assert panel.widgets.run_button.disabled
        finally:
            panel.widgets.compile.value = "off"
    assert panel.error is None and panel.explanation is not None


def test_a_distributed_run_with_compile_is_disabled_with_the_reason(panel: Panel) -> None:
    panel.set(compile="default", strategy="ddp", nproc=2)
    try:
        assert panel.widgets.run_button.disabled
        assert "distributed runs train eagerly" in panel.widgets.run_reason.value
    finally:
        panel.set(distributed=None, compile="off")
    assert not panel.widgets.run_button.disabled


def test_a_panel_comparison_with_compile_measures_each_plan_eager_and_compiled() -> None:
    from precision_nb.views.panel.session import compare_compiles

    made = Panel(steps=3, log_every=1, device="cpu", compile="reduce-overhead")
    try:
        assert compare_compiles(made.selection) == ("off", "reduce-overhead")
        made.set(compile="off")
        assert compare_compiles(made.selection) == ("off",)
    finally:
        made.close()


def test_the_compare_tab_shows_the_engines_compile_sentences() -> None:
    from types import SimpleNamespace

    from precision_nb.views.panel.results import compiled_html

    report = SimpleNamespace(lines=lambda: ["bf16+compile: pays back after 12 steps <x>"])
    block = compiled_html({"bf16+compile": report})
    assert "pnb-compiled" in block and "pays back after 12 steps &lt;x&gt;" in block
    assert compiled_html({}) == ""


def test_run_trains_the_compiled_plan_and_says_what_compiling_cost() -> None:
    """One compiled panel run (the mlp workload's tiny preset): the run's label, its compile
    record and the compile step among the events the Live tab lists."""
    made = Panel(steps=3, log_every=1, device="cpu", mode="fp32", compile="default")
    try:
        result = made.run(block=True, timeout=600)
        assert result.label == "fp32+compile" and result.compile is not None
        assert result.compile.compile_s > 0
        assert "compile step" in made.widgets.events_html.value
    finally:
        made.close()
