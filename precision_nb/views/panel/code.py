""" "Copy as code": the plain PyTorch loop that reproduces a resolved precision plan.

The snippet uses torch only (no precision_nb): the device, ``torch.autocast`` with the plan's
dtype, ``torch.amp.GradScaler`` when the plan uses a loss scaler, and ``torch.optim.AdamW`` with
the fused flag the optimizer build would use. A small stand-in model and random batches make it
run as pasted; the comments say where to put one's own model and data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CodeSpec", "fit_code", "plan_code"]

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


@dataclass(frozen=True)
class CodeSpec:
    """Everything the snippet needs, as plain values.

    ``device`` is the resolved device string (``"cpu"``, ``"cuda:0"``); ``dtype`` a dtype name
    (``"bf16"``, ``"torch.float16"``...) or None for fp32; ``fused`` the AdamW ``fused`` flag the
    snippet passes (None leaves torch's default).
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


def plan_code(spec: CodeSpec) -> str:
    """The plain PyTorch training loop for ``spec`` (a complete, runnable script)."""
    device_type = spec.device.split(":")[0]
    lines: list[str] = [
        f"# Plain PyTorch reproduction of the precision plan: {spec.mode} on {spec.device}.",
    ]
    if spec.note:
        lines += [f"# {part}" for part in spec.note.splitlines()]
    lines += [
        "import torch",
        "from torch import nn",
        "",
        f"torch.manual_seed({spec.seed})",
        f'device = torch.device("{spec.device}")',
        "",
        "# Replace the stand-in model, batches and loss with your own.",
        "model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).to(device)",
        "batches = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(8)]",
        "loss_fn = nn.CrossEntropyLoss()",
        "",
    ]
    fused = "" if spec.fused is None else f", fused={spec.fused}"
    lines += [
        "optimizer = torch.optim.AdamW(",
        f"    model.parameters(), lr={spec.lr!r}, betas={tuple(spec.betas)!r}, eps={spec.eps!r},",
        f"    weight_decay={spec.weight_decay!r}{fused},",
        ")",
    ]
    if spec.use_scaler:
        scaler_note = "" if device_type == "cuda" else "  # loss-scale lab: fp16 on CPU"
        lines.append(f'scaler = torch.amp.GradScaler("{device_type}"){scaler_note}')
    if spec.autocast_enabled:
        dtype = torch_dtype_name(spec.dtype)
        autocast = f'torch.autocast(device_type="{device_type}", dtype={dtype})'
    else:
        lines.append("# fp32: no autocast and no loss scaler.")
    lines += [
        f"steps, accumulation = {spec.steps}, {spec.accumulation}",
        "",
        "model.train()",
        "for step in range(steps):",
        "    optimizer.zero_grad(set_to_none=True)",
        "    for micro in range(accumulation):",
        "        x, y = batches[(step * accumulation + micro) % len(batches)]",
        "        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)",
    ]
    if spec.autocast_enabled:
        lines += [
            f"        with {autocast}:",
            "            loss = loss_fn(model(x), y) / accumulation",
        ]
    else:
        lines.append("        loss = loss_fn(model(x), y) / accumulation")
    if spec.use_scaler:
        lines += [
            "        scaler.scale(loss).backward()",
            "    scaler.step(optimizer)  # skipped when a gradient overflowed",
            "    scaler.update()  # lowers the scale after an overflow, raises it when stable",
        ]
    else:
        lines += [
            "        loss.backward()",
            "    optimizer.step()",
        ]
    lines += [
        "",
        'print(f"final loss {loss.item() * accumulation:.4f}")',
    ]
    return "\n".join(lines) + "\n"


def fit_code(
    *, model: str, precision: Any, distributed: Any, device: str, optimizer: Any, train: Any,
    note: str = "",
) -> str:  # fmt: skip
    """The ``pnb.fit(..., distributed=pnb.Distributed(...))`` call a distributed panel run makes.

    ``model`` is the first arguments as source text (``'"mlp", preset="tiny"'``); ``precision``
    (``PrecisionConfig``), ``distributed`` (``Distributed``), ``optimizer`` (``OptimizerConfig``)
    and ``train`` (``TrainConfig``) are written with their fields other than the defaults.
    """
    from dataclasses import fields

    def changed(value: Any, skip: tuple[str, ...] = ()) -> list[str]:
        return [
            f"{f.name}={getattr(value, f.name)!r}"
            for f in fields(value)
            if f.name not in skip and getattr(value, f.name) != f.default
        ]

    def call(name: str, value: Any, first: tuple[str, ...] = ()) -> str:
        args = [repr(getattr(value, f)) for f in first] + changed(value, first)
        return f"pnb.{name}({', '.join(args)})"

    lines = [
        "# The same run in code: torchrun starts the ranks; this process launches them.",
        *[f"# {part}" for part in note.splitlines() if part],
        "import precision_nb as pnb",
        "",
        "result = pnb.fit(",
        f"    {model},",
        f"    device={device!r},",
        f"    precision={call('PrecisionConfig', precision, ('mode',))},",
    ]
    if changed(optimizer):
        lines.append(f"    optimizer={call('OptimizerConfig', optimizer)},")
    lines.append(f"    distributed={call('Distributed', distributed, ('strategy', 'nproc'))},")
    lines += [f"    {arg}," for arg in changed(train, ("progress", "label"))]
    lines += [
        ")",
        "print(result.final_loss, result.startup_s)",
        "print(result.memory_table())  # bytes per rank by kind and dtype",
        "print(result.comm_table())  # bytes per step by rank, op and dtype",
    ]
    return "\n".join(lines) + "\n"
