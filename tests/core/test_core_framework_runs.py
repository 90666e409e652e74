"""The Accelerate and Transformers scripts run for one training step, as emitted, on this CPU.

Both are in the ``test`` extra; Lightning is not (its scripts are checked by their documented
strings in test_core_plan_code.py). The comments that say what does not carry over are checked
against the installed frameworks here, so they stay true when the frameworks change.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

import precision_nb as pnb

accelerate = pytest.importorskip("accelerate", reason="pip install accelerate (the test extra)")


def _run(code: str, tmp_path, monkeypatch) -> dict:
    monkeypatch.chdir(tmp_path)  # TrainingArguments(output_dir=...) is relative
    namespace: dict = {"__name__": "__snippet__"}
    exec(compile(code, "<plan-code>", "exec"), namespace)  # noqa: S102 - the test's point
    return namespace


def _reset_accelerate_state() -> None:
    """Accelerate keeps one process-wide state; a new Accelerator may set it up afresh."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def fresh_state():
    _reset_accelerate_state()
    yield
    _reset_accelerate_state()


@pytest.mark.parametrize(
    ("mode", "lab", "native_amp"),
    [("fp32", False, False), ("bf16", False, True), ("fp16", True, False)],
)
def test_accelerate_script_trains_one_step(mode, lab, native_amp, tmp_path, monkeypatch, capsys):
    code = pnb.plan(mode, "cpu", loss_scale_lab=lab).code("accelerate", steps=1)
    ns = _run(code, tmp_path, monkeypatch)
    assert "final loss" in capsys.readouterr().out and math.isfinite(ns["loss"].item())
    accelerator = ns["accelerator"]
    assert accelerator.mixed_precision == ("bf16" if mode == "bf16" else "no")
    assert accelerator.native_amp is native_amp and accelerator.scaler is None
    assert ns["step"] == 1 and accelerator.device.type == "cpu"


def test_accelerate_applies_no_fp16_autocast_on_a_cpu() -> None:
    """What the loss-scale-lab comment says: mixed_precision="fp16" on a CPU trains fp32."""
    accelerator = accelerate.Accelerator(mixed_precision="fp16", cpu=True)
    assert accelerator.native_amp is False and accelerator.scaler is None
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    assert model(torch.randn(2, 4)).dtype == torch.float32


def test_bf16_script_computes_in_bf16(tmp_path, monkeypatch) -> None:
    ns = _run(pnb.plan("bf16", "cpu").code("accelerate", steps=1), tmp_path, monkeypatch)
    seen = []
    ns["model"][0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    ns["model"](torch.randn(2, 64))  # prepare() wraps forward in autocast (output cast to fp32)
    assert seen == [torch.bfloat16]


transformers_needed = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="pip install transformers (the test extra)",
)


@transformers_needed
@pytest.mark.parametrize(("mode", "lab", "mixed"), [("bf16", False, "bf16"), ("fp16", True, "no")])
def test_transformers_script_trains_one_step(mode, lab, mixed, tmp_path, monkeypatch, capsys):
    code = pnb.plan(mode, "cpu", loss_scale_lab=lab).code("transformers", steps=1)
    ns = _run(code, tmp_path, monkeypatch)
    assert "mean training loss" in capsys.readouterr().out
    assert math.isfinite(ns["result"].training_loss) and ns["result"].global_step == 1
    trainer = ns["trainer"]
    assert trainer.accelerator.mixed_precision == mixed and trainer.accelerator.scaler is None
    assert trainer.args.optim == "adamw_torch" and trainer.args.max_grad_norm == 0.0


@transformers_needed
def test_transformers_fp16_on_a_cpu_trains_fp32(tmp_path, monkeypatch) -> None:
    """What the loss-scale-lab comment says for Trainer: fp16=True on a CPU has no scaler."""
    from transformers import Trainer, TrainingArguments

    monkeypatch.chdir(tmp_path)
    args = TrainingArguments(output_dir="o", fp16=True, use_cpu=True, report_to="none")
    trainer = Trainer(model=torch.nn.Linear(4, 4), args=args)
    assert args.fp16 and trainer.accelerator.device.type == "cpu"
    assert trainer.accelerator.native_amp is False and trainer.accelerator.scaler is None


@pytest.mark.parametrize("request_", ["bf16-true", "bf16-true+kahan"])
def test_a_true_plan_trains_its_bf16_model_in_accelerate(request_, tmp_path, monkeypatch, capsys):
    code = pnb.plan(request_, "cpu").code("accelerate", steps=1)
    assert "does not carry over as a setting: Accelerate has no true precision" in code
    ns = _run(code, tmp_path, monkeypatch)
    assert "final loss" in capsys.readouterr().out and math.isfinite(ns["loss"].item())
    assert ns["accelerator"].mixed_precision == "no"
    assert {p.dtype for p in ns["model"].parameters()} == {torch.bfloat16}
    state = next(iter(ns["optimizer"].optimizer.state.values()))
    assert ("kahan_comp" in state) is request_.endswith("kahan")


@transformers_needed
def test_a_true_plan_trains_its_bf16_model_in_the_transformers_trainer(
    tmp_path, monkeypatch, capsys
):
    code = pnb.plan("bf16-true+kahan", "cpu").code("transformers", steps=1)
    assert "TrainingArguments has no true precision" in code
    ns = _run(code, tmp_path, monkeypatch)
    assert math.isfinite(ns["result"].training_loss) and ns["result"].global_step == 1
    assert not ns["args"].bf16 and not ns["args"].fp16
    assert {p.dtype for p in ns["model"].parameters()} == {torch.bfloat16}
    assert type(ns["trainer"].optimizer.optimizer).__module__.startswith("optimi")
