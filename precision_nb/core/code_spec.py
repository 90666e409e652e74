"""What a script of a resolved plan needs, as plain values: :class:`CodeSpec`, the framework names,
and the pieces every framework's script shares (its header, the AdamW call, the TF32 note).
Imports the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from precision_nb.core.names import plan_label

if TYPE_CHECKING:  # pragma: no cover
    from precision_nb.core.resolution import Explanation

__all__ = [
    "FRAMEWORKS",
    "STAND_IN_MODEL",
    "REMEDY_CODE",
    "CodeSpec",
    "adamw_call",
    "code_spec",
    "framework_name",
    "fused_flag",
    "header",
    "remedy_import",
    "tf32_note",
    "torch_dtype_name",
]

#: framework key -> the name shown to people.
FRAMEWORKS: dict[str, str] = {
    "pytorch": "plain PyTorch",
    "lightning": "PyTorch Lightning",
    "accelerate": "Hugging Face Accelerate",
    "transformers": "Hugging Face Transformers (Trainer)",
}
_ALIASES = {"torch": "pytorch", "pl": "lightning", "hf": "transformers", "trainer": "transformers"}

#: Each spelling autocast code accepts ("fp16", "half", "float16", "torch.float16") -> its name.
_DTYPE_NAMES = {
    "fp16": "torch.float16",
    "float16": "torch.float16",
    "torch.float16": "torch.float16",
    "half": "torch.float16",
    "bf16": "torch.bfloat16",
    "bfloat16": "torch.bfloat16",
    "torch.bfloat16": "torch.bfloat16",
    "fp32": "torch.float32",
    "float32": "torch.float32",
    "torch.float32": "torch.float32",
}

STAND_IN_MODEL = "nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))"


@dataclass(frozen=True)
class CodeSpec:
    """Everything the code needs, as plain values.

    ``device`` is the resolved device string (``"cpu"``, ``"cuda:0"``); ``dtype`` a dtype name
    (``"bf16"``, ``"torch.float16"``...) or None for fp32; ``fused`` the AdamW ``fused`` flag the
    code passes (None leaves torch's default). ``simulated`` names the simulated hardware preset
    the plan was resolved for ("" for this machine).
    """

    device: str
    mode: str
    dtype: str | None
    autocast_enabled: bool
    use_scaler: bool
    fused: bool | None
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    steps: int = 20
    accumulation: int = 1
    seed: int = 0
    note: str = ""
    simulated: str = ""
    #: "off" or the ``torch.compile`` mode of the plan.
    compile_mode: str = "off"
    #: "mixed" (fp32 weights) or "true" (the model in ``true_dtype``); the true plan's remedy.
    weights: str = "mixed"
    remedy: str = "none"

    @property
    def label(self) -> str:
        """The plan's spelling: ``bf16``, ``bf16-true``, ``bf16-true+kahan``."""
        return plan_label(self.mode, self.weights, self.remedy)

    @property
    def true_dtype(self) -> str | None:
        """``torch.bfloat16`` / ``torch.float16`` for a true plan, else None."""
        return torch_dtype_name(self.mode) if self.weights == "true" else None

    @property
    def compile_call(self) -> str:
        """``torch.compile(model)`` arguments after the model: "" (default mode) or ``, mode=``."""
        return "" if self.compile_mode == "default" else f', mode="{self.compile_mode}"'

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def loss_scale_lab(self) -> bool:
        """fp16 with a GradScaler off CUDA: the CPU loss-scale lab."""
        return self.use_scaler and self.device_type != "cuda"


def torch_dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` style name for a dtype object or spelling."""
    key = str(dtype).strip().lower()
    try:
        return _DTYPE_NAMES[key]
    except KeyError:
        raise ValueError(
            f"dtype={dtype!r} has no autocast spelling; allowed: fp16, bf16, fp32 "
            "(or the torch dtype objects)"
        ) from None


def framework_name(framework: Any) -> str:
    """The key of :data:`FRAMEWORKS` for ``framework`` (any case; ``torch``, ``pl``, ``hf`` too)."""
    key = str(framework).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in FRAMEWORKS:
        raise ValueError(
            f"framework: invalid value {framework!r}; allowed: {', '.join(FRAMEWORKS)}"
        )
    return key


def fused_flag(explanation: Explanation) -> bool | None:
    """The AdamW ``fused`` flag the explanation's fused decision amounts to.

    Read from structured fields, not the outcome's wording: a request for fused AdamW holds unless
    the decision is a fallback; ``fused=False`` is plain AdamW; the probe (``None``) chooses fused
    only on CUDA (where it is probed, or expected on simulated hardware) and only without a
    fallback. No fused decision (no optimizer given): the request as it is.
    """
    requested = explanation.optimizer.fused
    decision = next((d for d in explanation.decisions if d.field == "fused AdamW"), None)
    if decision is None:
        return requested
    if requested is None:
        return explanation.plan.device_type == "cuda" and not decision.fallback
    return bool(requested) and not decision.fallback


def code_spec(
    explanation: Explanation, *, steps: int = 20, accumulation: int = 1, seed: int = 0
) -> CodeSpec:
    """The :class:`CodeSpec` of a resolved plan and the loop settings of the code."""
    plan = explanation.plan
    opt = explanation.optimizer
    for name, value in (("steps", steps), ("accumulation", accumulation)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: invalid value {value!r}; allowed: an integer >= 1")
    simulated = explanation.capabilities.name if explanation.simulated else ""
    return CodeSpec(
        device=explanation.device,
        mode=plan.mode,
        dtype=plan.mode if plan.autocast_enabled else None,
        autocast_enabled=plan.autocast_enabled,
        use_scaler=plan.use_scaler,
        fused=fused_flag(explanation),
        lr=opt.lr,
        betas=tuple(opt.betas),
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        steps=steps,
        accumulation=accumulation,
        seed=seed,
        simulated=simulated,
        compile_mode=explanation.compile.mode,
        weights=plan.weights,
        remedy=plan.remedy,
    )


def header(spec: CodeSpec, framework: str) -> list[str]:
    """The comment lines every script starts with: what it reproduces and for which hardware."""
    lines = [f"# {FRAMEWORKS[framework]}: the precision plan {spec.label} on {spec.device}."]
    if spec.simulated:
        lines.append(
            f"# Resolved for simulated hardware ({spec.simulated}); run it on such a machine."
        )
    lines += [f"# {part}" for part in spec.note.splitlines() if part]
    if spec.compile_mode != "off":
        lines.append(
            f"# torch.compile mode {spec.compile_mode}: the first step compiles, so it takes "
            "longer; later steps run the compiled code."
        )
    return lines


#: A true plan's remedy -> (its import line, the optimizer it builds).
REMEDY_CODE: dict[str, tuple[str, str]] = {
    "stochastic": (
        "from torchao.optim import _AdamW  # pip install torchao",
        "_AdamW(bf16_stochastic_round=True, ",
    ),
    "kahan": ("import optimi  # pip install torch-optimi", "optimi.AdamW(kahan_sum=True, "),
}


def remedy_import(spec: CodeSpec) -> list[str]:
    """The import line of a true plan's remedy library (none without a remedy)."""
    return [REMEDY_CODE[spec.remedy][0]] if spec.remedy in REMEDY_CODE else []


def adamw_call(spec: CodeSpec, params: str, prefix: str = "", indent: str = "") -> list[str]:
    """``PREFIXtorch.optim.AdamW(...)`` with the plan's settings and fused flag, over ``params``
    (a true plan's remedy: its library's AdamW with the same settings)."""
    fused = "" if spec.fused is None else f", fused={spec.fused}"
    if spec.remedy in REMEDY_CODE:
        name, switch = REMEDY_CODE[spec.remedy][1].split("(")
        return [
            f"{indent}{prefix}{name}(",
            f"{indent}    {params}, {switch}lr={spec.lr!r}, betas={tuple(spec.betas)!r},",
            f"{indent}    eps={spec.eps!r}, weight_decay={spec.weight_decay!r},",
            f"{indent})",
        ]
    return [
        f"{indent}{prefix}torch.optim.AdamW(",
        f"{indent}    {params}, lr={spec.lr!r}, betas={tuple(spec.betas)!r}, eps={spec.eps!r},",
        f"{indent}    weight_decay={spec.weight_decay!r}{fused},",
        f"{indent})",
    ]


def tf32_note(spec: CodeSpec) -> list[str]:
    """TF32 is no part of a plan: say so where it matters (CUDA)."""
    if spec.device_type != "cuda":
        return []
    return [
        "# TF32: not part of the plan; precision_nb leaves torch's TF32 settings as they are",
        "# (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32).",
    ]
