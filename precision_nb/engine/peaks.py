"""The peak a CUDA fp32 run's MFU divides by, chosen from what ran, and what an MFU above 1 says.

An fp32 plan on an Ampere or newer GPU is not all fp32 arithmetic: torch sends fp32
convolutions to TF32 tensor cores by default (``torch.backends.cudnn.conv.fp32_precision`` is
"tf32") and fp32 matmuls only when asked (``torch.backends.cuda.matmul.fp32_precision`` "tf32",
or ``torch.set_float32_matmul_precision("high")``). :func:`cuda_fp32_peak` takes the run's counted
FLOPs by class (:func:`~precision_nb.engine.metrics.count_step_flop_classes`) and the TF32 flags
it ran with (:func:`~precision_nb.engine.metrics.tf32_state`): the classes the flags send to TF32
are counted at the datasheet TF32 peak, the rest at the fp32 peak, and the peak of the mix is the
rate at which the step's FLOPs would finish with every class at its own peak. Attention and
"other" FLOPs are counted at the fp32 rate (which fp32 attention kernels use tensor cores is not
something torch reports); the source string says so when there are any.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from precision_nb.core.text import times_text
from precision_nb.engine.metrics import GPU_PEAK_TFLOPS, Peak, gpu_table_key

#: Plural names of the FLOP classes, as the peak's source and the hints say them.
CLASS_WORDS = {"convolution": "convolutions", "matmul": "matmuls", "attention": "attention"}
_SHORT = {"bfloat16": "bf16", "float16": "fp16"}


def tf32_classes(state: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The FLOP classes (:data:`~precision_nb.engine.metrics.FLOP_CLASSES`) that the recorded TF32
    flags send to TF32: per-op ``fp32_precision`` where torch has it, else the legacy flags."""
    if not state:
        return ()
    out = []
    conv = state.get("cudnn_conv_fp32_precision")
    if conv == "tf32" or (conv is None and state.get("cudnn_allow_tf32")):
        out.append("convolution")
    matmul = state.get("cuda_matmul_fp32_precision")
    high = state.get("float32_matmul_precision") in ("high", "medium")
    legacy = state.get("cuda_matmul_allow_tf32") or high
    if matmul == "tf32" or (matmul is None and legacy):
        out.append("matmul")
    return tuple(out)


def flags_text(state: Mapping[str, Any]) -> str:
    """The flags that decided it, as torch names them."""
    return (
        f"torch.backends.cudnn.conv.fp32_precision={state.get('cudnn_conv_fp32_precision')!r}, "
        "torch.backends.cuda.matmul.fp32_precision="
        f"{state.get('cuda_matmul_fp32_precision')!r}"
    )


def cuda_fp32_peak(
    device_name: str, flops: Mapping[str, int], state: Mapping[str, Any]
) -> Peak | None:
    """The datasheet peak of an fp32 step's FLOP mix on ``device_name`` (None: no table row).

    ``flops``: counted FLOPs by class; ``state``: :func:`~precision_nb.engine.metrics.tf32_state`
    as the run had it. Without TF32 work (a pre-Ampere GPU, flags off, or no FLOPs of the classes
    they cover) this is the fp32 column, and the source says why.
    """
    key = gpu_table_key(device_name)
    row = GPU_PEAK_TFLOPS.get(key or "", {})
    fp32 = row.get("float32")
    if fp32 is None:
        return None
    tf32 = row.get("tf32")
    total = sum(flops.values())
    on = tf32_classes(state) if tf32 is not None else ()
    at_tf32 = sum(n for c, n in flops.items() if c in on)
    label = f"datasheet: {key}"
    if not at_tf32 or total <= 0:
        if tf32 is None:
            why = "this GPU has no TF32"
        elif not on:
            why = f"the TF32 flags send nothing to TF32 ({flags_text(state)})"
        else:
            names = " or ".join(CLASS_WORDS.get(c, c) for c in on)
            why = f"no counted FLOPs are {names}, the work the TF32 flags send to TF32"
        return Peak(fp32 * 1e12, f"{label} float32 dense ({device_name}): {why}")
    seconds = at_tf32 / (tf32 * 1e12) + (total - at_tf32) / (fp32 * 1e12)
    rate = total / seconds
    names = " and ".join(CLASS_WORDS.get(c, c) for c in on if flops.get(c))
    rest = total - at_tf32
    fp32_part = (f", the other {rest / total:.0%} at the fp32 peak {fp32:g}" if rest else "") + (
        " (attention counted at the fp32 rate)" if flops.get("attention") else ""
    )
    return Peak(
        rate,
        f"{label} fp32 plan, dense ({device_name}): {names} ({at_tf32 / total:.0%} of the counted "
        f"FLOPs) at the TF32 peak {tf32:g} TFLOP/s{fp32_part}, as {flags_text(state)} send them: "
        f"{rate / 1e12:.1f} TFLOP/s for this mix if each part ran at its own peak",
    )


def beyond_peak(source: str | None) -> str:
    """Why an achieved rate can beat the peak, by where the peak came from (its ``source``)."""
    text = str(source or "")
    if text.startswith("measured"):
        return (
            "a calibration error: the peak was measured while the machine was busy, or the FLOP "
            "count is off"
        )
    if text.startswith("datasheet"):
        return (
            "a datasheet peak cannot be beaten, so the FLOP count (torch.utils.flop_counter) or "
            "the peak's assumptions (which FLOPs ran as TF32, dense rates, the GPU it names) are "
            "off"
        )
    return "the FLOP count or the peak is off"


def tf32_gain_note(
    device_name: str | None,
    flops: Mapping[str, int] | None,
    state: Mapping[str, Any] | None,
    dtype: str,
) -> str:
    """What ``dtype``'s datasheet peak gains over an fp32 baseline whose TF32 flags sent some of
    its FLOPs to TF32, from the counted FLOPs by class; "" when nothing ran as TF32 (then the
    fp32 column is the baseline's peak) or the table has no TF32 for the GPU."""
    key = gpu_table_key(device_name or "")
    row = GPU_PEAK_TFLOPS.get(key or "", {})
    tf32, low = row.get("tf32"), row.get(dtype)
    if tf32 is None or low is None or not flops or not state:
        return ""
    on = [c for c in tf32_classes(state) if flops.get(c)]
    if not on:
        return ""
    share = sum(flops[c] for c in on) / sum(flops.values())
    mix = cuda_fp32_peak(str(device_name), flops, state)
    whole = ""
    if mix is not None:
        rate = mix.flops_per_s
        whole = (
            f"; over its whole FLOP mix ({rate / 1e12:.1f} TFLOP/s) "
            f"{times_text(low * 1e12 / rate, '.1f')}"
        )
    return (
        f" The fp32 baseline ran its {' and '.join(CLASS_WORDS.get(c, c) for c in on)} "
        f"({share:.0%} of its counted FLOPs) as TF32 ({flags_text(state)}): for that work the "
        f"{_SHORT.get(dtype, dtype)} peak is {times_text(low / tf32, '.1f')} the TF32 peak "
        f"(datasheet {key}: {low:g} / {tf32:g} TFLOP/s){whole}."
    )
