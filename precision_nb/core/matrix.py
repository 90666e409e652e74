"""The resolution rules as data: the rows a plan can come from, and the key that picks each row.

A request is keyed by ``(device type, request, capability)`` (:func:`rule_key`); :data:`RULES` maps
each key to the id of a :class:`MatrixRow` in :data:`MATRIX` and the reason shown to the user.
:func:`lookup` is a dictionary look-up, with ``"*"`` as the capability when it does not matter.
The table is documented in ``docs/plans.md#resolution-rules`` and a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass

from precision_nb.core.capabilities import Capabilities

#: Where the resolution rules are listed for users.
RULES_DOC = "docs/plans.md#resolution-rules"


@dataclass(frozen=True)
class MatrixRow:
    """One row of the resolution rules.

    ``source`` is "listed" for the twelve base rules, "implied" for cases they do not list (CUDA
    explicit fp32; device types other than CUDA/CPU/MPS), "lab" for the opt-in loss-scale lab
    (CPU fp16 with a CPU GradScaler) and "true" for the rows of a ``-true`` request (weights,
    gradients and optimizer state in the low dtype), which the base rules do not have.
    ``weights``: "mixed" (fp32 weights) or "true".
    """

    id: str
    device: str
    request: str
    mode: str
    scaler: bool
    autocast: bool
    source: str = "listed"
    note: str = ""
    weights: str = "mixed"


MATRIX: tuple[MatrixRow, ...] = (
    MatrixRow("cuda-auto-bf16", "CUDA", "auto, BF16 supported", "bf16", False, True),
    MatrixRow("cuda-auto-no-bf16", "CUDA", "auto, BF16 unsupported", "fp16", True, True),
    MatrixRow("cuda-bf16", "CUDA", "explicit bf16, supported", "bf16", False, True),
    MatrixRow(
        "cuda-bf16-unsupported", "CUDA", "explicit bf16, unsupported/error", "fp32", False, False
    ),
    MatrixRow("cuda-fp16", "CUDA", "explicit fp16", "fp16", True, True),
    MatrixRow("cpu-auto", "CPU", "auto", "fp32", False, False),
    MatrixRow("cpu-fp32", "CPU", "explicit fp32", "fp32", False, False),
    MatrixRow("cpu-fp16", "CPU", "explicit fp16", "fp32", False, False),
    MatrixRow("cpu-bf16", "CPU", "explicit bf16", "bf16", False, True),
    MatrixRow("mps-auto", "MPS", "auto", "fp32", False, False),
    MatrixRow("mps-mixed", "MPS", "explicit mixed mode", "fp32", False, False),
    MatrixRow("mps-fp32", "MPS", "explicit fp32", "fp32", False, False),
    MatrixRow(
        "cuda-fp32", "CUDA", "explicit fp32", "fp32", False, False, "implied",
        "not listed by the base rules; fp32 is what was asked for",
    ),
    MatrixRow(
        "other-device", "other", "any", "fp32", False, False, "implied",
        "device types outside CUDA/CPU/MPS (e.g. meta, xpu) are not in the base rules",
    ),
    MatrixRow(
        "cpu-fp16-lab", "CPU", "explicit fp16 + loss-scale lab", "fp16", True, True, "lab",
        "opt-in loss-scale lab: CPU autocast fp16 with torch.amp.GradScaler('cpu')",
    ),
    MatrixRow(
        "cuda-bf16-true", "CUDA", "explicit bf16-true, supported", "bf16", False, False, "true",
        "weights, gradients and AdamW state in bf16; no autocast", "true",
    ),
    MatrixRow(
        "cuda-bf16-true-unsupported", "CUDA", "explicit bf16-true, unsupported/error", "fp32",
        False, False, "true", "as explicit bf16 there: fp32, not another low dtype",
    ),
    MatrixRow(
        "cuda-fp16-true", "CUDA", "explicit fp16-true", "fp16", False, False, "true",
        "fp16 weights without a scaler: torch's GradScaler refuses fp16 gradients", "true",
    ),
    MatrixRow(
        "cpu-bf16-true", "CPU", "explicit bf16-true", "bf16", False, False, "true",
        "weights, gradients and AdamW state in bf16; no autocast", "true",
    ),
    MatrixRow(
        "cpu-fp16-true", "CPU", "explicit fp16-true", "fp32", False, False, "true",
        "as explicit fp16 on CPU: fp32",
    ),
    MatrixRow(
        "mps-true", "MPS", "explicit bf16-true or fp16-true", "fp32", False, False, "true",
        "as every explicit low precision on MPS: fp32",
    ),
)  # fmt: skip
ROWS: dict[str, MatrixRow] = {row.id: row for row in MATRIX}

_LAB = "loss-scale lab (loss_scale_lab=True)"
#: Why MPS stays fp32: this project's rule, not a limit of torch or of the hardware.
MPS_RULE = (
    "this project's resolution rule, not a limit of torch: torch itself has autocast kernels "
    "for MPS"
)

#: An explicit bf16 request on CUDA whose BF16 query says no or raises, mixed and true.
_NO_BF16 = ("cuda-bf16-unsupported", "explicit bf16 on CUDA but {bf16}: falls back to fp32")
_NO_BF16_TRUE = (
    "cuda-bf16-true-unsupported",
    "explicit bf16-true on CUDA but {bf16}: falls back to fp32 (weights and math), as "
    "explicit bf16 does",
)
#: (device type, request, capability) -> (row id, reason). The capability is the CUDA BF16 query
#: ("supported" | "unsupported" | "error") where it decides, else "*". Reasons are ``str.format``
#: templates with ``{bf16}`` (what the BF16 query said), ``{request}`` and ``{device}``.
RULES: dict[tuple[str, str, str], tuple[str, str]] = {
    ("cuda", "auto", "supported"): ("cuda-auto-bf16", "auto on CUDA and {bf16}"),
    ("cuda", "auto", "unsupported"): ("cuda-auto-no-bf16", "auto on CUDA and {bf16}"),
    ("cuda", "auto", "error"): (
        "cuda-auto-no-bf16",
        "auto on CUDA and {bf16} (a raising query counts as unsupported)",
    ),
    ("cuda", "bf16", "supported"): ("cuda-bf16", "explicit bf16 on CUDA and {bf16}"),
    ("cuda", "bf16", "unsupported"): _NO_BF16,
    ("cuda", "bf16", "error"): _NO_BF16,
    ("cuda", "fp16", "*"): ("cuda-fp16", "explicit fp16 on CUDA"),
    ("cuda", "fp32", "*"): (
        "cuda-fp32",
        "explicit fp32 on CUDA (a row the base rules imply but do not list)",
    ),
    ("cpu", "auto", "*"): (
        "cpu-auto",
        "auto on CPU stays fp32 for broad custom-module compatibility",
    ),
    ("cpu", "fp32", "*"): ("cpu-fp32", "explicit fp32 on CPU"),
    ("cpu", "fp16", "*"): (
        "cpu-fp16",
        "explicit fp16 on CPU falls back to fp32: there is no CPU GradScaler path by default "
        f"(the {_LAB} studies CPU fp16 with a CPU GradScaler)",
    ),
    ("cpu", "fp16+lab", "*"): (
        "cpu-fp16-lab",
        f"explicit fp16 on CPU with the {_LAB}: an opt-in outside the base rules "
        "(CPU autocast fp16 with torch.amp.GradScaler('cpu'))",
    ),
    ("cpu", "bf16", "*"): (
        "cpu-bf16",
        "explicit bf16 on CPU is kept with CPU autocast; CPU BF16 capability is not checked "
        "(by design) and depends on the torch build and custom operators - verify_autocast() "
        "checks what is really computed",
    ),
    ("mps", "auto", "*"): ("mps-auto", f"auto on MPS stays fp32 ({MPS_RULE})"),
    ("mps", "fp32", "*"): ("mps-fp32", "explicit fp32 on MPS"),
    ("mps", "bf16", "*"): ("mps-mixed", f"explicit bf16 on MPS falls back to fp32 ({MPS_RULE})"),
    ("mps", "fp16", "*"): ("mps-mixed", f"explicit fp16 on MPS falls back to fp32 ({MPS_RULE})"),
    ("cuda", "bf16-true", "supported"): (
        "cuda-bf16-true",
        "explicit bf16-true on CUDA and {bf16}: the model's floating-point parameters and "
        "buffers, its gradients and the AdamW state are bf16; no autocast",
    ),
    ("cuda", "bf16-true", "unsupported"): _NO_BF16_TRUE,
    ("cuda", "bf16-true", "error"): _NO_BF16_TRUE,
    ("cuda", "fp16-true", "*"): (
        "cuda-fp16-true",
        "explicit fp16-true on CUDA: fp16 weights, gradients and AdamW state and no grad "
        "scaler (torch's GradScaler refuses to unscale fp16 gradients, so no loss scale can "
        "rescue them): gradients below fp16's smallest subnormal (2**-24) become 0. torch's "
        "plain AdamW (for-loop or foreach) keeps exp_avg_sq in fp16, where (1-beta2)*grad**2 "
        "underflows to 0 and eps=1e-8 rounds to 0, so its update is NaN or inf there; the fused "
        "AdamW kernel computes in fp32 and does not, so fp16-true needs optimizer.fused not "
        "false",
    ),
    ("cpu", "bf16-true", "*"): (
        "cpu-bf16-true",
        "explicit bf16-true on CPU: the model's floating-point parameters and buffers, its "
        "gradients and the AdamW state are bf16; no autocast. CPU BF16 capability is not "
        "checked, as for explicit bf16",
    ),
    ("cpu", "fp16-true", "*"): (
        "cpu-fp16-true",
        "explicit fp16-true on CPU falls back to fp32, as explicit fp16 on CPU does (the "
        "resolution rules run no fp16 on CPU outside the loss-scale lab, and the lab's "
        "GradScaler cannot unscale fp16 gradients)",
    ),
    ("mps", "bf16-true", "*"): (
        "mps-true",
        f"explicit bf16-true on MPS falls back to fp32 ({MPS_RULE})",
    ),
    ("mps", "fp16-true", "*"): (
        "mps-true",
        f"explicit fp16-true on MPS falls back to fp32 ({MPS_RULE})",
    ),
    ("other", "any", "*"): (
        "other-device",
        "device type {device!r} is not in the resolution rules (CUDA, CPU, MPS): fp32 without "
        "autocast or scaler is the only choice known to be safe there",
    ),
}


def bf16_text(caps: Capabilities) -> str:
    """What ``torch.cuda.is_bf16_supported()`` said, in words."""
    if caps.cuda_bf16 == "error":
        return f"torch.cuda.is_bf16_supported() raised ({caps.cuda_bf16_error or 'error'})"
    return f"torch.cuda.is_bf16_supported() is {caps.cuda_bf16 == 'supported'}"


def rule_key(
    requested: str,
    loss_scale_lab: bool,
    device_type: str,
    caps: Capabilities,
    weights: str = "mixed",
) -> tuple[str, str, str]:
    """The :data:`RULES` key of a request ("auto"/"fp32"/"bf16"/"fp16", with ``weights``
    "mixed" or "true") on a device type."""
    if device_type not in ("cuda", "cpu", "mps"):
        return "other", "any", "*"
    if weights == "true":
        requested = f"{requested}-true"
    if device_type == "cpu" and requested == "fp16" and loss_scale_lab:
        requested = "fp16+lab"
    if device_type == "cuda" and requested in ("auto", "bf16", "bf16-true"):
        return "cuda", requested, caps.cuda_bf16
    return device_type, requested, "*"


def lookup(
    requested: str,
    loss_scale_lab: bool,
    device_type: str,
    caps: Capabilities,
    weights: str = "mixed",
) -> tuple[MatrixRow, str]:
    """The row that applies and the reason, for a request on a device with these capabilities."""
    row_id, template = RULES[rule_key(requested, loss_scale_lab, device_type, caps, weights)]
    reason = template.format(bf16=bf16_text(caps), request=requested, device=device_type)
    return ROWS[row_id], reason
