"""Panel without training: controls, live plan, simulated badge, errors, copy-as-code."""

from __future__ import annotations

import html
import math
import re

import pytest
import torch

from precision_nb.core.plan_code import CodeSpec, plan_code
from precision_nb.views.panel import Panel
from precision_nb.views.panel.controller import PanelController


@pytest.fixture(scope="module")
def panel() -> Panel:
    return Panel(steps=5)


@pytest.fixture(autouse=True)
def _reset(panel: Panel) -> None:
    panel.set(device="cpu", mode="auto", dtype=None, fused=None, loss_scale_lab=False)


def _classes(widget) -> set[str]:
    return set(widget._dom_classes)


def test_key_widgets_carry_stable_css_classes(panel: Panel) -> None:
    found: set[str] = set()

    def walk(w) -> None:
        found.update(c for c in getattr(w, "_dom_classes", ()) if c.startswith("pnb-"))
        for child in getattr(w, "children", ()):
            walk(child)

    walk(panel.widget)
    for css in (
        "pnb-panel",
        "pnb-device",
        "pnb-mode",
        "pnb-dtype",
        "pnb-fused",
        "pnb-workload",
        "pnb-preset",
        "pnb-steps",
        "pnb-accumulation",
        "pnb-lab",
        "pnb-compare-plans",
        "pnb-run",
        "pnb-compare",
        "pnb-stop",
        "pnb-plan",
        "pnb-error",
        "pnb-progress",
        "pnb-progress-label",
        "pnb-figures",
        "pnb-figure-button",
        "pnb-figures-note",
        "pnb-results",
        "pnb-badge",
        "pnb-code",
        "pnb-run-reason",
        "pnb-status",
    ):
        assert css in found, css


def test_device_menu_lists_real_devices_then_simulated_presets(panel: Panel) -> None:
    options = panel.widgets.device.options
    values = [value for _label, value in options]
    assert values[:2] == ["auto", "cpu"]
    simulated = [(label, value) for label, value in options if value.startswith("sim:")]
    assert {"sim:cuda-bf16", "sim:cuda-no-bf16", "sim:mps"} <= {v for _l, v in simulated}
    assert all(label.startswith("[simulated]") for label, _v in simulated)
    real = [label for label, value in options if not value.startswith("sim:")]
    assert not any("simulated" in label for label in real)


def test_widget_change_resolves_plan_and_marks_matrix_row(panel: Panel) -> None:
    panel.widgets.mode.value = "bf16"  # as a click on the toggle would
    assert panel.plan.mode == "bf16" and panel.plan.autocast_enabled
    assert "bf16 on cpu" in panel.plan_text
    html = panel.widgets.plan_html.value
    applied = re.search(r'<tr[^>]*data-row="([^"]+)"><td>&#9654; applied', html)
    assert applied is not None and applied.group(1) == "cpu-bf16"
    assert "explicit bf16 on CPU is kept" in html  # the decision's reason is shown

    panel.widgets.mode.value = "fp16"
    assert panel.plan.mode == "fp32"  # the matrix's CPU fp16 fallback
    assert 'data-row="cpu-fp16"><td>&#9654; applied' in panel.widgets.plan_html.value
    assert "(fallback)" in panel.widgets.plan_html.value


def test_dtype_enabled_only_when_mode_is_auto(panel: Panel) -> None:
    controls = panel.widgets
    assert panel.selection.mode == "auto" and not controls.dtype.disabled
    panel.set(dtype="bf16")
    assert panel.plan.mode == "bf16"  # auto + dtype bf16 requests bf16
    for mode in ("fp32", "bf16", "fp16"):
        panel.set(mode=mode)
        assert controls.dtype.disabled, mode
    panel.set(mode="fp32")
    assert panel.plan.mode == "fp32"
    dtype_decision = next(d for d in panel.explanation.decisions if d.field == "dtype")
    assert "ignored" in dtype_decision.reason
    panel.set(mode="auto")
    assert not controls.dtype.disabled


def test_loss_scale_lab_only_applies_to_fp16_on_cpu(panel: Panel) -> None:
    lab = panel.widgets.loss_scale_lab
    assert lab.disabled  # auto on CPU
    panel.set(mode="bf16")
    assert lab.disabled
    panel.set(mode="fp16")
    assert not lab.disabled
    assert panel.plan.mode == "fp32"
    panel.set(loss_scale_lab=True)
    assert panel.plan.mode == "fp16" and panel.plan.use_scaler
    assert 'data-row="cpu-fp16-lab"><td>&#9654; applied' in panel.widgets.plan_html.value
    # fp16 on (simulated) CUDA already has its scaler: the lab does not apply there
    panel.set(device="cuda-no-bf16")
    assert lab.disabled
    assert "ignored here" in panel.widgets.lab_note.value
    assert panel.explanation.config.loss_scale_lab is False
    # auto with dtype fp16 is an fp16 request too
    panel.set(device="cpu", mode="auto", dtype="fp16")
    assert not lab.disabled and panel.plan.mode == "fp16"


def test_simulated_hardware_shows_badge_and_disables_run(panel: Panel) -> None:
    assert "this machine" in panel.widgets.badge.value
    assert "pnb-simulated" not in _classes(panel.widgets.badge)
    assert not panel.widgets.run_button.disabled

    panel.set(device="cuda-bf16")  # the preset name works without the sim: prefix
    assert panel.selection.device == "sim:cuda-bf16"
    assert panel.simulated
    assert "SIMULATED" in panel.widgets.badge.value and "cuda-bf16" in panel.widgets.badge.value
    assert "pnb-simulated" in _classes(panel.widgets.badge)
    assert panel.plan.mode == "bf16" and panel.plan.device_type == "cuda"
    assert panel.widgets.run_button.disabled and panel.widgets.compare_button.disabled
    assert "simulated hardware" in panel.widgets.run_reason.value
    with pytest.raises(RuntimeError, match="simulated"):
        panel.run()
    assert 'device = torch.device("cuda")' in panel.code
    assert "simulated hardware" in panel.code

    panel.set(device="sim:cuda-no-bf16")
    assert panel.plan.mode == "fp16" and panel.plan.use_scaler
    assert 'torch.amp.GradScaler("cuda")' in panel.code

    panel.set(device="cpu")
    assert not panel.simulated and not panel.widgets.run_button.disabled
    assert panel.widgets.run_reason.value == ""


def test_bad_input_raises_and_is_shown_in_the_panel(panel: Panel) -> None:
    before = panel.plan
    with pytest.raises(
        ValueError, match=r"mode: invalid value 'fp8'.*allowed: 'auto', 'fp32', 'bf16', 'fp16'"
    ):
        panel.set(mode="fp8")
    with pytest.raises(ValueError, match=r"dtype: invalid value 'fp8'.*or None"):
        panel.set(dtype="fp8")
    assert panel.error is not None and "fp8" in panel.error
    assert "fp8" in panel.widgets.error_box.value
    assert panel.widgets.error_box.layout.display != "none"
    assert panel.plan == before  # nothing changed
    with pytest.raises(ValueError, match=r"steps: invalid value 0 .*from 1 to"):
        panel.set(steps=0)
    with pytest.raises(ValueError, match="'tpu:3'"):
        panel.set(device="tpu:3")
    with pytest.raises(RuntimeError, match="cuda:7"):
        panel.set(device="cuda:7")  # CUDA is not on this machine (or not 8 devices)
    assert panel.selection.device == "cpu" and "cuda:7" in panel.error
    with pytest.raises(ValueError, match="preset='huge'"):
        panel.set(preset="huge")
    # the panel stays usable: a good value clears the message
    panel.set(mode="bf16")
    assert panel.error is None and panel.widgets.error_box.layout.display == "none"
    assert panel.plan.mode == "bf16"


def test_typed_device_is_resolved_and_errors_show_in_the_panel(panel: Panel) -> None:
    text = panel.widgets.device_text
    text.value = "cuda:7"  # as typed into the "Other device" box
    assert panel.selection.device == "cuda:7"
    assert panel.plan is None and panel.error is not None
    assert "cuda:7" in panel.error and "cuda:7" in panel.widgets.error_box.value
    assert (
        panel.widgets.run_button.disabled and "cannot be resolved" in panel.widgets.run_reason.value
    )
    text.value = ""  # clearing it falls back to the menu's device
    assert panel.error is None and panel.plan.device_type == "cpu"
    assert not panel.widgets.run_button.disabled
    text.value = "cpu"
    assert panel.plan is not None and panel.error is None
    panel.widgets.device.value = "auto"  # picking from the menu replaces the typed device
    assert text.value == "" and panel.selection.device == "auto"


def test_set_refreshes_once(panel: Panel, monkeypatch) -> None:
    calls: list[int] = []
    original = PanelController.refresh

    def counting(self: PanelController) -> None:
        calls.append(1)
        original(self)

    monkeypatch.setattr(PanelController, "refresh", counting)
    panel.set(mode="bf16", device="cpu", fused="off", steps=7, seed=3)
    assert len(calls) == 1
    # the one refresh saw every value: the plan and the code reflect all of them
    assert panel.plan.mode == "bf16" and panel.plan.autocast_enabled
    assert "fused=False" in panel.code and "torch.manual_seed(3)" in panel.code
    assert "steps, accumulation = 7, 1" in panel.code


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="batches is None"):
        Panel(model=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="train_options\\['steps'\\]"):
        Panel(train_options={"steps": 3})
    with pytest.raises(ValueError, match="not a TrainConfig field"):
        Panel(train_options={"bogus": 1})
    with pytest.raises(ValueError, match="mode: invalid value .int8."):
        Panel(mode="int8")


def test_fused_choice_reaches_explanation_and_code(panel: Panel) -> None:
    panel.set(fused="off")
    fused = next(d for d in panel.explanation.decisions if d.field == "fused AdamW")
    assert fused.outcome == "plain AdamW" and "fused=False" in panel.code
    panel.set(fused=True)
    fused = next(d for d in panel.explanation.decisions if d.field == "fused AdamW")
    assert panel.selection.fused is True
    # a request for fused AdamW holds unless this torch falls back (no CPU fused kernel)
    assert ("fused=False" if fused.fallback else "fused=True") in panel.code


def _exec_snippet(code: str) -> dict:
    namespace: dict = {"__name__": "__snippet__"}
    exec(compile(code, "<copy-as-code>", "exec"), namespace)  # noqa: S102 - the test's point
    return namespace


@pytest.mark.parametrize(
    ("settings", "mode", "autocast_dtype", "scaler"),
    [
        ({"mode": "fp32"}, "fp32", None, False),
        ({"mode": "bf16"}, "bf16", torch.bfloat16, False),
        ({"mode": "fp16", "loss_scale_lab": True}, "fp16", torch.float16, True),
    ],
)
def test_copy_as_code_runs_and_reproduces_cpu_plan(
    panel: Panel, settings: dict, mode: str, autocast_dtype, scaler: bool, capsys
) -> None:
    panel.set(steps=6, accumulation=2, **settings)
    assert panel.plan.mode == mode
    code = panel.code
    assert "precision_nb" not in code.replace("without precision_nb", "")
    namespace = _exec_snippet(code)
    assert "final loss" in capsys.readouterr().out
    assert math.isfinite(namespace["loss"].item())
    assert namespace["device"] == torch.device("cpu")
    assert isinstance(namespace["optimizer"], torch.optim.AdamW)
    assert ("scaler" in namespace) is scaler
    if scaler:
        assert namespace["scaler"].is_enabled()
        assert namespace["scaler"].get_scale() > 0
    if autocast_dtype is None:
        assert "torch.autocast" not in code
    else:
        assert f'torch.autocast(device_type="cpu", dtype={autocast_dtype})' in code
    assert namespace["steps"] == 6 and namespace["accumulation"] == 2


def test_plan_code_rejects_unknown_dtype() -> None:
    spec = CodeSpec("cpu", "fp8", "fp8", True, False, None)
    with pytest.raises(ValueError, match="dtype='fp8'"):
        plan_code(spec)


def test_user_model_panel_hides_workloads() -> None:
    model = torch.nn.Linear(4, 2)
    batches = [(torch.randn(3, 4), torch.randint(0, 2, (3,)))]
    panel = Panel(model, batches, mode="bf16")
    assert panel.widgets.workload.disabled and panel.widgets.preset.disabled
    assert panel.widgets.workload.value == "your model"
    assert panel.selection.workload is None
    with pytest.raises(ValueError, match="workload cannot be chosen"):
        panel.set(workload="mlp")
    assert panel.plan.mode == "bf16"


def test_panel_displays_as_its_widget(panel: Panel) -> None:
    bundle = panel._repr_mimebundle_()
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == panel.widget.model_id
    # plain-text readers (nbconvert to text, diffs, logs) get the plan, not the widget tree
    text = bundle["text/plain"]
    assert text.endswith(panel.explanation.summary()) and "VBox(" not in text


def test_fused_flag_of_the_code_follows_the_decision_not_its_wording(panel: Panel) -> None:
    panel.set(device="sim:cuda-bf16", fused=None)  # the probe expects fused AdamW on CUDA
    assert "fused=True" in panel.code
    panel.set(fused="off")
    assert "fused=False" in panel.code
    panel.set(device="cpu", fused=None)  # off CUDA the probe gives plain AdamW
    assert "fused=False" in panel.code


def test_true_plans_in_the_mode_menu_and_their_refusals_in_the_error_box(panel: Panel) -> None:
    assert {"bf16-true", "bf16-true+stochastic", "bf16-true+kahan"} <= set(
        panel.widgets.mode.options
    )
    panel.set(device="cpu", mode="BF16-true+Kahan")
    assert panel.plan.label == "bf16-true+kahan" and panel.plan.true_weights
    assert "optimi.AdamW(" in panel.code and "dtype=torch.bfloat16" in panel.code
    assert "bf16-true+kahan" in panel.widgets.headline.value
    panel.set(fused="on")  # a valid control value whose combination the plan refuses
    assert panel.plan is None and "optimizer.fused: invalid value True with remedy" in panel.error
    assert "True with remedy" in panel.widgets.error_box.value
    assert panel.widgets.run_button.disabled
    with pytest.raises(ValueError, match="no true variant"):
        panel.set(mode="fp32-true")
    panel.set(fused="probe", mode="bf16-true")
    assert panel.error is None and not panel.widgets.run_button.disabled


def test_the_compare_list_takes_true_plans_as_the_mode_menu_spells_them(panel: Panel) -> None:
    panel.set(compare_plans=("fp32", "BF16-true+Kahan", "bf16-mixed"))
    assert panel.widgets.compare_plans.value == ("fp32", "bf16-true+kahan", "bf16")
    for bad, words in (
        ("fp32-true", "compare_plans: invalid value 'fp32-true': an fp32 plan has no true"),
        ("bf16-true+magic", "unknown remedy 'magic'"),
    ):
        with pytest.raises(ValueError, match=re.escape(words)):
            panel.set(compare_plans=("fp32", bad))
        assert html.escape(words, quote=True) in panel.widgets.error_box.value
    assert panel.widgets.compare_plans.value == ("fp32", "bf16-true+kahan", "bf16")


def test_a_remedy_whose_library_is_missing_disables_run_and_names_the_extra(
    panel: Panel, monkeypatch
) -> None:
    from precision_nb.core import remedies

    monkeypatch.setattr(remedies, "installed", lambda name: False)
    panel.set(device="cpu", mode="bf16-true+stochastic")
    assert panel.plan is not None and panel.widgets.run_button.disabled
    assert "precision-nb[remedies]" in panel.widgets.run_reason.value
    assert "NOT installed" in panel.plan_text
    panel.set(mode="bf16")
    assert not panel.widgets.run_button.disabled
