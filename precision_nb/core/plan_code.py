"""A resolved plan as code: plain PyTorch, PyTorch Lightning, Hugging Face Accelerate, Transformers.

One text generator for the panel's "Copy as code", ``Explanation.code()`` / ``pnb.plan()`` and
``precision-nb plan --as``: :func:`plan_code` writes a complete script for one framework. This
module has the plain PyTorch loop and the ``pnb.fit(..., distributed=...)`` call (the others are in
:mod:`precision_nb.core.framework_code`). Imports the standard library only.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from precision_nb.core import framework_code
from precision_nb.core.code_spec import (
    FRAMEWORKS,
    STAND_IN_MODEL,
    CodeSpec,
    adamw_call,
    code_spec,
    framework_name,
    header,
    remedy_import,
    tf32_note,
    torch_dtype_name,
)

__all__ = [
    "FRAMEWORKS",
    "CodeSpec",
    "code_spec",
    "fit_code",
    "framework_name",
    "plan_code",
    "torch_dtype_name",
]


def plan_code(spec: CodeSpec, framework: str = "pytorch") -> str:
    """A complete, runnable script for ``spec`` in ``framework`` (a key of :data:`FRAMEWORKS`)."""
    key = framework_name(framework)
    if key == "pytorch":
        return _pytorch(spec)
    return framework_code.WRITERS[key](spec)


def _pytorch(spec: CodeSpec) -> str:
    """The plain PyTorch training loop (torch only, no precision_nb)."""
    device_type = spec.device_type
    lines = header(spec, "pytorch") + tf32_note(spec)
    true = spec.true_dtype
    lines += ["import torch", "from torch import nn", *remedy_import(spec)]
    lines += [
        "",
        f"torch.manual_seed({spec.seed})",
        f'device = torch.device("{spec.device}")',
        "",
        "# Replace the stand-in model, batches and loss with your own.",
    ]
    if true:
        lines += [
            f"# {spec.label}: the model's floating-point parameters and buffers in {true}",
            "# (integer buffers stay), so gradients and AdamW state are too; no autocast.",
            f"model = {STAND_IN_MODEL}",
            f"model = model.to(device, dtype={true})",
        ]
    else:
        lines.append(f"model = {STAND_IN_MODEL}.to(device)")
    lines += [
        "batches = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(8)]",
        "loss_fn = nn.CrossEntropyLoss()",
        "",
    ]
    if spec.compile_mode != "off":
        lines += [
            "# The model is compiled; autocast and the scaler stay outside it, in the loop.",
            f"model = torch.compile(model{spec.compile_call})",
        ]
    lines += adamw_call(spec, "model.parameters()", "optimizer = ")
    if spec.use_scaler:
        scaler_note = "" if device_type == "cuda" else "  # loss-scale lab: fp16 on CPU"
        lines.append(f'scaler = torch.amp.GradScaler("{device_type}"){scaler_note}')
    autocast = ""
    if spec.autocast_enabled:
        dtype = torch_dtype_name(spec.dtype)
        autocast = f'torch.autocast(device_type="{device_type}", dtype={dtype})'
    elif not true:
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
    if true:
        lines.append(f"        x = x.to({true})  # floating-point inputs in the model's dtype")
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
