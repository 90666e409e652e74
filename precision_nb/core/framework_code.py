"""A resolved plan as PyTorch Lightning, Hugging Face Accelerate and Transformers configuration.

Each writer turns a :class:`~precision_nb.core.code_spec.CodeSpec` into a runnable script with a
stand-in model and random data, using the framework's documented settings
(``lightning.Trainer(precision=...)``, ``accelerate.Accelerator(mixed_precision=...)``,
``transformers.TrainingArguments(bf16=..., fp16=..., tf32=..., optim=...)``). What a framework does
differently from the plan (the CPU loss-scale lab, a true plan, which Accelerate and the
Transformers ``Trainer`` have no setting for, TF32, fused AdamW's interplay with a scaler, simulated
hardware, settings whose framework default differs) is stated as a comment where it applies. Imports
the standard library only; the scripts import the frameworks.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from precision_nb.core.code_spec import (
    REMEDY_CODE,
    STAND_IN_MODEL,
    CodeSpec,
    adamw_call,
    header,
    remedy_import,
    tf32_note,
)

#: The longest comment line a written script holds.
COMMENT_WIDTH = 96

__all__ = [
    "WRITERS",
    "accelerate_code",
    "accelerate_mixed_precision",
    "lightning_code",
    "lightning_precision",
    "transformers_code",
]


def _lab_not_carried(setting: str, who: str) -> list[str]:
    """Why the CPU loss-scale lab becomes fp32 in a framework that runs AMP through Accelerate
    (comment lines folded at :data:`COMMENT_WIDTH`, whatever the framework's name)."""
    text = (
        "The plan is the loss-scale lab (fp16 autocast with a CPU GradScaler), which does not "
        f"carry over: on a CPU, {who} applies neither fp16 autocast nor a GradScaler, so "
        f"{setting} would train fp32 anyway. This trains fp32; to watch loss scaling on a CPU, "
        "use the plain PyTorch version of this plan."
    )
    return textwrap.wrap(text, COMMENT_WIDTH, initial_indent="# ", subsequent_indent="# ")


def _index(spec: CodeSpec) -> int | None:
    """The CUDA device index of ``cuda:N`` (None for ``cuda`` or another device)."""
    _, _, index = spec.device.partition(":")
    return int(index) if spec.device_type == "cuda" and index.isdigit() else None


def _visible_devices_note(spec: CodeSpec, framework: str) -> list[str]:
    index = _index(spec)
    if not index:
        return []
    return [
        f"# cuda:{index}: {framework} uses the CUDA device of its process; start it with "
        f"CUDA_VISIBLE_DEVICES={index} for this one."
    ]


def _fused_comment(spec: CodeSpec) -> str:
    if spec.remedy in REMEDY_CODE:
        return f"# {spec.label}: the remedy's library AdamW (torch's fused AdamW does not apply)."
    if spec.fused is None:
        return "# AdamW as the plan builds it: torch's default implementation."
    return f"# fused={spec.fused}: the plan's fused AdamW decision."


def _true_by_hand(spec: CodeSpec, framework: str, setting: str) -> list[str]:
    """What a true plan becomes in a framework that has no true precision setting."""
    if not spec.true_dtype:
        return []
    return [
        f"# {spec.label} does not carry over as a setting: {framework} has no true precision",
        f"# ({setting} is the mixed plan, fp32 weights under autocast). What to write instead:",
        f"# precision off and the model cast by hand (model.to({spec.true_dtype})), so its",
        "# gradients and AdamW state follow its dtype; floating-point inputs are cast to it too.",
    ]


def lightning_precision(spec: CodeSpec) -> str:
    """``Trainer(precision=...)`` of the plan: ``32-true``, ``bf16-mixed``, ``16-mixed``,
    ``bf16-true`` or ``16-true``."""
    if not spec.true_dtype and not spec.autocast_enabled:
        return "32-true"
    return ("bf16" if spec.mode == "bf16" else "16") + ("-true" if spec.true_dtype else "-mixed")


def lightning_code(spec: CodeSpec) -> str:
    """A ``LightningModule`` and a ``Trainer`` set up as the plan."""
    accelerator = {"cuda": "cuda", "mps": "mps"}.get(spec.device_type, "cpu")
    index = _index(spec)
    devices = f"[{index}]" if index is not None else "1"
    model = "LitModel()"
    if spec.compile_mode != "off":  # the model as the plan trains it
        model = f"torch.compile({model}{spec.compile_call})"
    lines = header(spec, "lightning") + tf32_note(spec)
    if spec.loss_scale_lab:
        lines += [
            "# The loss-scale lab (fp16 autocast with a CPU GradScaler) goes in as a precision",
            '# plugin: Trainer(precision="16-mixed") on a CPU trains "bf16-mixed" instead',
            "# (Lightning warns so).",
        ]
    if spec.autocast_enabled and spec.fused:
        lines += [
            "# Fused AdamW under Lightning's mixed precision: Lightning refuses gradient clipping",
            "# (Trainer(gradient_clip_val=...)) with an optimizer that unscales in its own step.",
        ]
    if spec.true_dtype:
        lines += [
            f'# precision="{lightning_precision(spec)}": Lightning casts the module and the inputs'
            f" to {spec.true_dtype};",
            "# no autocast and no master copy.",
        ]
    lines += [
        "import lightning as L",
        "import torch",
        "from torch import nn",
        "from torch.utils.data import DataLoader, TensorDataset",
        *remedy_import(spec),
    ]
    if spec.loss_scale_lab:
        lines.append("from lightning.pytorch.plugins import MixedPrecision")
    lines += [
        "",
        f"torch.manual_seed({spec.seed})",
        "",
        "",
        "class LitModel(L.LightningModule):",
        "    # Replace the stand-in model and loss with your own.",
        "    def __init__(self):",
        "        super().__init__()",
        f"        self.model = {STAND_IN_MODEL}",
        "        self.loss_fn = nn.CrossEntropyLoss()",
        "",
        "    def training_step(self, batch, batch_idx):",
        "        x, y = batch",
        "        return self.loss_fn(self.model(x), y)",
        "",
        "    def configure_optimizers(self):",
        f"        {_fused_comment(spec)}",
        *adamw_call(spec, "self.parameters()", "return ", "        "),
        "",
        "",
        "data = TensorDataset(torch.randn(256, 64), torch.randint(0, 10, (256,)))",
        "trainer = L.Trainer(",
        f'    accelerator="{accelerator}",',
        f"    devices={devices},",
    ]
    if spec.loss_scale_lab:
        lines.append(
            '    plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))],'
        )
    else:
        lines.append(f'    precision="{lightning_precision(spec)}",')
    lines += [
        f"    max_steps={spec.steps},",
        f"    accumulate_grad_batches={spec.accumulation},",
        "    logger=False,",
        "    enable_checkpointing=False,",
        ")",
        f"trainer.fit({model}, DataLoader(data, batch_size=32, shuffle=True))",
    ]
    return "\n".join(lines) + "\n"


def accelerate_mixed_precision(spec: CodeSpec) -> str:
    """``Accelerator(mixed_precision=...)`` of the plan: ``no``, ``bf16`` or ``fp16``."""
    if not spec.autocast_enabled or spec.loss_scale_lab:
        return "no"
    return "bf16" if spec.mode == "bf16" else "fp16"


def accelerate_code(spec: CodeSpec) -> str:
    """An ``Accelerator`` and a loop of ``accelerator.backward`` set up as the plan."""
    lines = header(spec, "accelerate") + tf32_note(spec) + _visible_devices_note(spec, "Accelerate")
    dtype = f", dtype={spec.true_dtype}" if spec.true_dtype else ""  # the inputs of a true plan
    if spec.loss_scale_lab:
        lines += _lab_not_carried('mixed_precision="fp16"', "Accelerate")
    lines += _true_by_hand(spec, "Accelerate", 'mixed_precision="bf16"')
    lines += ["import torch", "from accelerate import Accelerator", *remedy_import(spec)]
    if spec.compile_mode != "off":
        lines.append("from accelerate.utils import TorchDynamoPlugin")
    lines += [
        "from torch import nn",
        "from torch.utils.data import DataLoader, TensorDataset",
        "",
        f"torch.manual_seed({spec.seed})",
        "accelerator = Accelerator(",
        f'    mixed_precision="{accelerate_mixed_precision(spec)}",',
    ]
    if spec.device_type == "cpu":
        lines.append("    cpu=True,")
    if spec.compile_mode != "off":
        mode = "" if spec.compile_mode == "default" else f', mode="{spec.compile_mode}"'
        lines.append(f'    dynamo_plugin=TorchDynamoPlugin(backend="inductor"{mode}),')
    lines += [
        f"    gradient_accumulation_steps={spec.accumulation},",
        ")",
        "",
        "# Replace the stand-in model, data and loss with your own.",
        f"model = {STAND_IN_MODEL}" + (f".to({spec.true_dtype})" if spec.true_dtype else ""),
        f"data = TensorDataset(torch.randn(256, 64{dtype}), torch.randint(0, 10, (256,)))",
        "loader = DataLoader(data, batch_size=32, shuffle=True)",
        "loss_fn = nn.CrossEntropyLoss()",
        _fused_comment(spec),
        *adamw_call(spec, "model.parameters()", "optimizer = "),
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)",
        "",
        f"steps, step = {spec.steps}, 0",
        "model.train()",
        "while step < steps:",
        "    for x, y in loader:",
        "        with accelerator.accumulate(model):",
        "            loss = loss_fn(model(x), y)",
        "            accelerator.backward(loss)  # scales the loss when a GradScaler is in use",
        "            optimizer.step()  # skipped after an overflow when a GradScaler is in use",
        "            optimizer.zero_grad()",
        "        if accelerator.sync_gradients:",
        "            step += 1",
        "            if step == steps:",
        "                break",
        "",
        'print(f"final loss {loss.item():.4f}")',
    ]
    return "\n".join(lines) + "\n"


def transformers_code(spec: CodeSpec) -> str:
    """``TrainingArguments`` set up as the plan, and a ``Trainer`` over a stand-in model."""
    bf16 = spec.autocast_enabled and spec.mode == "bf16"
    fp16 = spec.autocast_enabled and spec.mode == "fp16" and not spec.loss_scale_lab
    optim = "adamw_torch_fused" if spec.fused else "adamw_torch"
    dtype = f", dtype={spec.true_dtype}" if spec.true_dtype else ""  # the inputs of a true plan
    lines = header(spec, "transformers") + _visible_devices_note(spec, "Trainer")
    if spec.loss_scale_lab:
        lines += _lab_not_carried("fp16=True", "Trainer (through Accelerate)")
    lines += _true_by_hand(spec, "TrainingArguments", "bf16=True")
    if spec.remedy in REMEDY_CODE:
        lines += [
            "# The remedy's optimizer is built here and handed to the Trainer",
            "# (optimizers=(optimizer, None)); TrainingArguments' optim names none of them.",
        ]
    lines += [
        "import torch",
        "from torch import nn",
        "from transformers import Trainer, TrainingArguments",
        *remedy_import(spec),
        "",
        f"torch.manual_seed({spec.seed})",
        "",
        "",
        "class StandIn(nn.Module):",
        "    # Replace with your model; Trainer reads the loss from the output's 'loss'.",
        "    def __init__(self):",
        "        super().__init__()",
        f"        self.net = {STAND_IN_MODEL}",
        "",
        "    def forward(self, x, labels=None):",
        "        logits = self.net(x)",
        "        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)",
        '        return {"loss": loss, "logits": logits}',
        "",
        "",
        'data = [{"x": torch.randn(64' + dtype + '), "labels": i % 10} for i in range(256)]',
        "args = TrainingArguments(",
        '    output_dir="precision-nb-trainer",',
        f"    bf16={bf16},",
        f"    fp16={fp16},",
    ]
    if spec.device_type == "cuda":
        lines.append("    tf32=None,  # not part of the plan: None leaves torch's TF32 settings")
    else:
        lines.append("    # tf32 unset: TrainingArguments(tf32=True) needs an Ampere or newer GPU")
    if spec.device_type == "cpu":
        lines.append("    use_cpu=True,")
    if spec.compile_mode != "off":
        lines += ["    torch_compile=True,", '    torch_compile_backend="inductor",']
        if spec.compile_mode != "default":
            lines.append(f'    torch_compile_mode="{spec.compile_mode}",')
    lines += [
        f'    optim="{optim}",  # the plan\'s fused AdamW decision (the default varies with torch)',
        f"    learning_rate={spec.lr!r},",
        f"    adam_beta1={spec.betas[0]!r},",
        f"    adam_beta2={spec.betas[1]!r},",
        f"    adam_epsilon={spec.eps!r},",
        f"    weight_decay={spec.weight_decay!r},",
        '    lr_scheduler_type="constant",  # as precision_nb by default (Trainer: "linear")',
        "    max_grad_norm=0.0,  # no clipping, as precision_nb by default (Trainer: 1.0)",
        f"    max_steps={spec.steps},",
        f"    gradient_accumulation_steps={spec.accumulation},",
        "    per_device_train_batch_size=32,",
        f"    seed={spec.seed},",
        '    report_to="none",',
        '    save_strategy="no",',
        ")",
        "model = StandIn()" + (f".to({spec.true_dtype})" if spec.true_dtype else ""),
    ]
    optimizers = ""
    if spec.remedy in REMEDY_CODE:
        lines += adamw_call(spec, "model.parameters()", "optimizer = ")
        optimizers = ", optimizers=(optimizer, None)"
    lines += [
        f"trainer = Trainer(model=model, args=args, train_dataset=data{optimizers})",
        "result = trainer.train()",
        'print(f"mean training loss {result.training_loss:.4f}")',
    ]
    return "\n".join(lines) + "\n"


#: framework key -> writer (plain PyTorch is :func:`precision_nb.core.plan_code.plan_code`).
WRITERS: dict[str, Callable[[CodeSpec], str]] = {
    "lightning": lightning_code,
    "accelerate": accelerate_code,
    "transformers": transformers_code,
}
