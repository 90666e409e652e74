"""The spec's resolution matrix, row by row, through simulated capabilities and patched torch."""

from __future__ import annotations

import json

import pytest
import torch

from precision_nb import (
    MATRIX,
    Capabilities,
    PrecisionConfig,
    PrecisionPlan,
    explain_precision,
    get_capabilities,
    resolve_precision,
)

# The spec's table, typed in from spec/device-and-precision.md (device, request) -> (mode, scaler,
# autocast), with the hardware each row needs as a preset and as patched torch queries.
A100 = ("cuda-bf16", {"cuda": True, "bf16": True})
V100 = ("cuda-no-bf16", {"cuda": True, "bf16": False})
BROKEN = ("cuda-bf16-error", {"cuda": True, "bf16": RuntimeError("driver too old")})
CPU = ("cpu-only", {"cuda": False})
MAC = ("mps", {"cuda": False, "mps": True})

SPEC_ROWS = [
    # hardware, device, request, mode, scaler, autocast
    (A100, "cuda", "auto", "bf16", False, True),
    (V100, "cuda", "auto", "fp16", True, True),
    (A100, "cuda", "bf16", "bf16", False, True),
    (V100, "cuda", "bf16", "fp32", False, False),
    (BROKEN, "cuda", "bf16", "fp32", False, False),
    (A100, "cuda", "fp16", "fp16", True, True),
    (V100, "cuda", "fp16", "fp16", True, True),
    (CPU, "cpu", "auto", "fp32", False, False),
    (CPU, "cpu", "fp32", "fp32", False, False),
    (CPU, "cpu", "fp16", "fp32", False, False),
    (CPU, "cpu", "bf16", "bf16", False, True),
    (MAC, "mps", "auto", "fp32", False, False),
    (MAC, "mps", "bf16", "fp32", False, False),
    (MAC, "mps", "fp16", "fp32", False, False),
    (MAC, "mps", "fp32", "fp32", False, False),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _expected(device: str, mode: str, scaler: bool, autocast: bool) -> PrecisionPlan:
    return PrecisionPlan(mode, DTYPES[mode], scaler, autocast, device)


@pytest.mark.parametrize("hw,device,request_,mode,scaler,autocast", SPEC_ROWS)
def test_matrix_row_with_simulated_capabilities(hw, device, request_, mode, scaler, autocast):
    plan = resolve_precision(PrecisionConfig(mode=request_), device, capabilities=hw[0])
    assert plan == _expected(device, mode, scaler, autocast)
    assert plan.is_mixed_precision is (mode != "fp32")


@pytest.mark.parametrize("hw,device,request_,mode,scaler,autocast", SPEC_ROWS)
def test_matrix_row_with_patched_torch(fake_torch, hw, device, request_, mode, scaler, autocast):
    fake_torch(**hw[1])
    plan = resolve_precision(PrecisionConfig(mode=request_), torch.device(device))
    assert plan == _expected(device, mode, scaler, autocast)


@pytest.mark.parametrize("hw,device", [(A100, "cuda"), (V100, "cuda"), (CPU, "cpu"), (MAC, "mps")])
def test_auto_device_then_auto_precision_with_patched_torch(fake_torch, hw, device):
    fake_torch(**hw[1])
    explanation = explain_precision(PrecisionConfig())
    assert explanation.device == device
    assert explanation.plan.device_type == device


def test_torch_is_read_at_call_time(fake_torch):
    fake_torch(cuda=True, bf16=True)
    assert resolve_precision(PrecisionConfig(), "cuda").mode == "bf16"
    fake_torch(cuda=True, bf16=False)
    assert resolve_precision(PrecisionConfig(), "cuda").mode == "fp16"


def test_auto_with_raising_bf16_query_is_treated_as_unsupported():
    plan = resolve_precision(PrecisionConfig(), "cuda", capabilities="cuda-bf16-error")
    assert (plan.mode, plan.use_scaler) == ("fp16", True)


def test_cuda_explicit_fp32_is_an_implied_row():
    e = explain_precision(PrecisionConfig("fp32"), "cuda", capabilities="cuda-bf16")
    assert e.plan == _expected("cuda", "fp32", False, False)
    assert e.row is not None and e.row.source == "implied"
    assert any("implied" in w for w in e.warnings)


@pytest.mark.parametrize("device", ["meta", "xpu"])
def test_other_device_types_resolve_to_fp32_with_a_reason(device):
    e = explain_precision(PrecisionConfig("bf16"), device, capabilities="cpu-only")
    assert e.plan == _expected(device, "fp32", False, False)
    mode = next(d for d in e.decisions if d.field == "mode")
    assert mode.fallback and repr(device) in mode.reason


# --- the dtype rule: precision.dtype counts only when mode is auto ---------------------------


@pytest.mark.parametrize(
    "config,preset,device,mode",
    [
        (PrecisionConfig("auto", "fp16"), "cuda-bf16", "cuda", "fp16"),
        (PrecisionConfig("auto", "bf16"), "cpu-only", "cpu", "bf16"),
        (PrecisionConfig("auto", "fp32"), "cuda-bf16", "cuda", "fp32"),
        (PrecisionConfig("fp32", "bf16"), "cuda-bf16", "cuda", "fp32"),
        (PrecisionConfig("fp16", "bf16"), "cuda-bf16", "cuda", "fp16"),
        (PrecisionConfig("auto", "fp16"), "cpu-only", "cpu", "fp32"),
    ],
)
def test_dtype_counts_only_in_auto_mode(config, preset, device, mode):
    assert resolve_precision(config, device, capabilities=preset).mode == mode


def test_ignored_dtype_is_a_recorded_decision():
    e = explain_precision(PrecisionConfig("fp32", "bf16"), "cuda", capabilities="cuda-bf16")
    dtype = next(d for d in e.decisions if d.field == "dtype")
    assert dtype.fallback and "ignored" in dtype.reason


# --- explanation ---------------------------------------------------------------------------


def test_decisions_are_ordered_and_complete():
    e = explain_precision(PrecisionConfig(), "auto", capabilities="cuda-bf16")
    fields = [d.field for d in e.decisions]
    assert fields == ["device", "mode", "dtype", "scaler", "autocast", "fused AdamW"]


@pytest.mark.parametrize(
    "config,device,preset,words",
    [
        (PrecisionConfig("fp16"), "cpu", "cpu-only", "GradScaler"),
        (PrecisionConfig("bf16"), "cuda", "cuda-no-bf16", "is_bf16_supported() is False"),
        (PrecisionConfig("bf16"), "cuda", "cuda-bf16-error", "raised"),
        (PrecisionConfig("fp16"), "mps", "mps", "MPS"),
        (PrecisionConfig("bf16"), "mps", "mps", "MPS"),
    ],
)
def test_every_spec_fallback_is_a_flagged_decision(config, device, preset, words):
    e = explain_precision(config, device, capabilities=preset)
    assert e.plan.mode == "fp32"
    (mode,) = [d for d in e.decisions if d.field == "mode"]
    assert mode.fallback and words in mode.reason
    assert mode in e.fallbacks
    assert "(fallback)" in str(e)


def test_emulated_bf16_warns_and_native_does_not():
    t4 = explain_precision(PrecisionConfig(), "cuda", capabilities="cuda-bf16-emulated")
    assert t4.plan.mode == "bf16"  # the spec's query counts emulation
    assert any("emulated" in w and "slower than fp16" in w for w in t4.warnings)
    a100 = explain_precision(PrecisionConfig(), "cuda", capabilities="cuda-bf16")
    assert not any("emulated" in w for w in a100.warnings)


def test_loss_scale_lab_is_opt_in_and_says_so():
    lab = explain_precision(PrecisionConfig("fp16", loss_scale_lab=True), "cpu")
    assert lab.plan == PrecisionPlan("fp16", torch.float16, True, True, "cpu")
    assert any("outside the resolution rules" in w for w in lab.warnings)
    assert resolve_precision(PrecisionConfig("fp16"), "cpu").mode == "fp32"
    # the lab changes nothing but an explicit fp16 request on CPU
    cuda = explain_precision(
        PrecisionConfig("bf16", loss_scale_lab=True), "cuda", capabilities="cuda-bf16"
    )
    assert cuda.plan.mode == "bf16"
    assert any(d.field == "loss_scale_lab" and d.outcome == "no effect" for d in cuda.decisions)


def test_str_names_plan_row_and_hardware():
    text = str(explain_precision(PrecisionConfig(), "cuda", capabilities="cuda-no-bf16"))
    assert "fp16 on cuda" in text
    assert "cuda-auto-no-bf16" in text
    assert "cuda-no-bf16 (simulated)" in text


def test_html_shows_whole_matrix_with_applied_row_marked_and_escapes_text():
    caps = Capabilities(
        name="<b>lab</b>", simulated=True, cuda_available=False, description="<script>x</script>"
    )
    e = explain_precision(PrecisionConfig("bf16"), "cpu", capabilities=caps)
    page = e._repr_html_()
    assert page.count("data-row=") == len(MATRIX)
    assert page.count("applied") == 1
    applied = page.split("applied")[0].rsplit("data-row=", 1)[1]
    assert applied.startswith('"cpu-bf16"')
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<b>lab</b>" not in page


def test_to_dict_is_json_and_carries_plan_and_decisions():
    e = explain_precision(PrecisionConfig("auto", "fp16"), "cuda", capabilities="cuda-bf16")
    data = json.loads(json.dumps(e.to_dict()))
    assert data["plan"]["mode"] == "fp16" and data["plan"]["use_scaler"] is True
    assert data["simulated"] is True
    assert [d["field"] for d in data["decisions"]][0] == "device"
    assert data["row"]["id"] == e.row.id


def test_absent_hardware_raises_runtime_error_in_explain():
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        explain_precision(PrecisionConfig(), "cuda", capabilities="cpu-only")


def test_explanation_for_this_machine_matches_resolution():
    caps = get_capabilities()
    e = explain_precision(PrecisionConfig("bf16"), "cpu", capabilities=caps)
    assert e.plan == resolve_precision(PrecisionConfig("bf16"), "cpu", capabilities=caps)
    assert e.simulated is False


def test_plain_text_display_is_the_explanation_not_the_dataclass_fields():
    # what nbconvert to text, a notebook diff or a log shows for an explanation left as a cell's
    # value: IPython's pretty printer, which falls back to the dataclass repr without _repr_pretty_
    from IPython.lib.pretty import pretty

    e = explain_precision(PrecisionConfig("fp16"), "cpu", capabilities="cpu-only")
    shown = pretty(e)
    assert shown == str(e)
    assert shown.startswith("Precision plan: fp32 on cpu") and "Explanation(" not in shown


def test_html_marks_with_css_classes_not_inline_colours():
    e = explain_precision(PrecisionConfig("fp16"), "cpu", capabilities="cpu-only")
    page = e._repr_html_()
    assert "style=" not in page  # colours live in one <style> block, keyed by class
    assert '<tr class="pnb-current" data-row="cpu-fp16">' in page
    assert page.count('class="pnb-fallback"') == len(e.fallbacks) >= 1
    assert "docs/plans.md#resolution-rules" in page


@pytest.mark.parametrize("preset", ["cpu-only", "cuda-bf16", "cuda-bf16-emulated", "mps"])
@pytest.mark.parametrize("mode", ["auto", "fp32", "bf16", "fp16"])
@pytest.mark.parametrize("lab", [False, True])
def test_no_message_speaks_of_a_spec_and_the_rule_is_linked(preset, mode, lab):
    devices = {"cpu-only": "cpu", "mps": "mps"}
    device = devices.get(preset, "cuda")
    e = explain_precision(PrecisionConfig(mode, loss_scale_lab=lab), device, capabilities=preset)
    text = str(e)
    assert "spec" not in text.lower()
    assert "docs/plans.md#resolution-rules" in text
    mode_reason = next(d.reason for d in e.decisions if d.field == "mode")
    assert f"resolution rule {e.row.id!r}" in mode_reason


def test_a_true_request_explains_its_weights_and_remedy_and_falls_back_with_them():
    import precision_nb as pnb

    e = pnb.plan("bf16-true+kahan", "cpu")
    fields = [d.field for d in e.decisions]
    assert fields[-2:] == ["fused AdamW", "remedy"] and "weights" in fields
    assert e.plan.true_weights and e.plan.remedy == "kahan" and not e.plan.autocast_enabled
    assert e.label == "bf16-true+kahan" and not e.fallbacks
    down = pnb.plan("bf16-true+kahan", simulate="cuda-no-bf16")
    assert down.plan.mode == "fp32" and not down.plan.true_weights and down.plan.remedy == "none"
    weights = next(d for d in down.fallbacks if d.field == "weights")
    assert "remedy 'kahan' dropped" in weights.reason
    assert [d.field for d in pnb.plan("bf16", "cpu").decisions][-1] == "fused AdamW"
    assert pnb.resolve_precision("bf16-true", "cpu").label == "bf16-true"
