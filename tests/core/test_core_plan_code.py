"""The plan as code in each framework: the documented spellings, and what does not carry over.

Lightning is not installed for the tests, so its scripts are checked against its documented
strings (``Trainer(precision="32-true" | "bf16-mixed" | "16-mixed")``, the ``MixedPrecision``
plugin); Accelerate and Transformers scripts are run in tests/core/test_core_framework_runs.py.
"""

from __future__ import annotations

import ast

import pytest

import precision_nb as pnb
from precision_nb.core import framework_code
from precision_nb.core.plan_code import FRAMEWORKS, CodeSpec, framework_name, plan_code

# (request, device, simulate, loss-scale lab) -> the plan a framework is set up for
CPU_FP32 = ("fp32", "cpu", None, False)
CPU_BF16 = ("bf16", "cpu", None, False)
CPU_LAB = ("fp16", "cpu", None, True)
CUDA_BF16 = ("bf16", "auto", "cuda-bf16", False)
CUDA_FP16 = ("fp16", "auto", "cuda-bf16", False)
NO_BF16_AUTO = ("auto", "auto", "cuda-no-bf16", False)  # auto: fp16 on a GPU without bf16
CPU_TRUE = ("bf16-true+stochastic", "cpu", None, False)
CUDA_FP16_TRUE = ("fp16-true", "auto", "cuda-bf16", False)


def _explain(case):
    mode, device, simulate, lab = case
    return pnb.plan(mode, device, simulate=simulate, loss_scale_lab=lab)


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
@pytest.mark.parametrize(
    "case",
    [CPU_FP32, CPU_BF16, CPU_LAB, CUDA_BF16, CUDA_FP16, NO_BF16_AUTO, CPU_TRUE, CUDA_FP16_TRUE],
)
def test_every_script_is_valid_python_and_names_the_plan(case, framework) -> None:
    explanation = _explain(case)
    code = explanation.code(framework)
    ast.parse(code)
    first = code.splitlines()[0]
    assert FRAMEWORKS[framework] in first and f"plan {explanation.plan.label} on" in first
    assert ("simulated hardware" in code) is explanation.simulated
    assert ("TF32" in code) is (explanation.plan.device_type == "cuda")


@pytest.mark.parametrize(
    ("case", "precision"),
    [(CPU_FP32, "32-true"), (CPU_BF16, "bf16-mixed"), (CUDA_BF16, "bf16-mixed"),
     (CUDA_FP16, "16-mixed"), (NO_BF16_AUTO, "16-mixed"), (CPU_TRUE, "bf16-true"),
     (CUDA_FP16_TRUE, "16-true")],
)  # fmt: skip
def test_lightning_gets_its_documented_precision_string(case, precision) -> None:
    code = _explain(case).code("lightning")
    assert f'    precision="{precision}",' in code
    assert "import lightning as L" in code and "L.Trainer(" in code
    accelerator = "cuda" if case[2] else "cpu"
    assert f'accelerator="{accelerator}"' in code


def test_lightning_runs_the_cpu_loss_scale_lab_through_its_precision_plugin() -> None:
    code = _explain(CPU_LAB).code("lightning")
    assert "from lightning.pytorch.plugins import MixedPrecision" in code
    plugin = 'plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))]'
    assert plugin in code and "precision=" not in code.replace("# ", "").split("L.Trainer(")[1]
    assert '"16-mixed") on a CPU trains "bf16-mixed" instead' in code.replace("\n# ", " ")


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_lightning_warns_about_clipping_with_fused_adamw_under_mixed_precision(mode) -> None:
    fused = pnb.plan(mode, simulate="cuda-bf16", fused=True).code("lightning")
    plain = pnb.plan(mode, simulate="cuda-bf16", fused=False).code("lightning")
    fp32 = pnb.plan("fp32", simulate="cuda-bf16", fused=True).code("lightning")
    assert "refuses gradient clipping" in fused and "fused=True" in fused
    assert "refuses gradient clipping" not in plain and "fused=False" in plain
    assert "refuses gradient clipping" not in fp32 and "fused=True" in fp32


@pytest.mark.parametrize(
    ("case", "mixed"),
    [(CPU_FP32, "no"), (CPU_BF16, "bf16"), (CPU_LAB, "no"), (CUDA_BF16, "bf16"),
     (CUDA_FP16, "fp16")],
)  # fmt: skip
def test_accelerate_gets_its_documented_mixed_precision(case, mixed) -> None:
    code = _explain(case).code("accelerate")
    assert f'    mixed_precision="{mixed}",' in code
    assert ("    cpu=True," in code) is (case[1] == "cpu")
    assert ("loss-scale lab" in code) is case[3]


@pytest.mark.parametrize(
    ("case", "flags"),
    [(CPU_FP32, (False, False)), (CPU_BF16, (True, False)), (CPU_LAB, (False, False)),
     (CUDA_BF16, (True, False)), (CUDA_FP16, (False, True))],
)  # fmt: skip
def test_training_arguments_get_bf16_fp16_tf32_and_optim(case, flags) -> None:
    code = _explain(case).code("transformers")
    assert f"    bf16={flags[0]},\n    fp16={flags[1]}," in code
    cuda = case[2] is not None
    assert ("    tf32=None," in code) is cuda and ("use_cpu=True" in code) is (not cuda)
    assert 'lr_scheduler_type="constant"' in code and "max_grad_norm=0.0" in code


@pytest.mark.parametrize("fused", [True, False])
def test_each_framework_carries_the_fused_adamw_decision(fused) -> None:
    explanation = pnb.plan("bf16", simulate="cuda-bf16", fused=fused)
    assert f"fused={fused}" in explanation.code("pytorch")
    assert f"fused={fused}" in explanation.code("lightning")
    assert f"fused={fused}" in explanation.code("accelerate")
    optim = "adamw_torch_fused" if fused else "adamw_torch"
    assert f'optim="{optim}",' in explanation.code("transformers")


def test_cuda_n_says_how_to_pick_the_device_where_the_framework_picks_it(
    fake_torch, monkeypatch
) -> None:
    import torch

    fake_torch(cuda=True, bf16=True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    explanation = pnb.plan("bf16", "cuda:2")
    assert "devices=[2]" in explanation.code("lightning")
    assert "CUDA_VISIBLE_DEVICES=2" in explanation.code("accelerate")
    assert "CUDA_VISIBLE_DEVICES=2" in explanation.code("transformers")


def test_loop_settings_reach_every_framework() -> None:
    explanation = pnb.plan("bf16", "cpu")
    assert "steps, accumulation = 7, 3" in explanation.code("pytorch", steps=7, accumulation=3)
    lit = explanation.code("lightning", steps=7, accumulation=3, seed=5)
    assert "max_steps=7" in lit and "accumulate_grad_batches=3" in lit
    assert "torch.manual_seed(5)" in lit
    acc = explanation.code("accelerate", steps=7, accumulation=3)
    assert "gradient_accumulation_steps=3" in acc and "steps, step = 7, 0" in acc
    hf = explanation.code("transformers", steps=7, accumulation=3, seed=5)
    assert "max_steps=7" in hf and "gradient_accumulation_steps=3" in hf and "seed=5" in hf
    with pytest.raises(ValueError, match="steps: invalid value 0"):
        explanation.code("pytorch", steps=0)


@pytest.mark.parametrize(
    ("given", "key"),
    [("PyTorch", "pytorch"), (" PL ", "lightning"), ("hf", "transformers"),
     ("accelerate", "accelerate")],
)  # fmt: skip
def test_framework_names_and_aliases(given, key) -> None:
    assert framework_name(given) == key


def test_an_unknown_framework_names_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"framework: invalid value 'keras'; allowed: pytorch"):
        plan_code(CodeSpec("cpu", "fp32", None, False, False, None), "keras")


def test_every_framework_has_a_writer() -> None:
    assert set(framework_code.WRITERS) | {"pytorch"} == set(FRAMEWORKS)


def test_pnb_plan_resolves_like_explain_precision() -> None:
    explanation = pnb.plan("fp16", simulate="cuda-bf16-emulated", fused=False)
    assert explanation.plan.mode == "fp16" and explanation.plan.use_scaler
    assert explanation.simulated and explanation.optimizer.fused is False
    same = pnb.explain_precision(
        "fp16", "auto", "cuda-bf16-emulated", pnb.OptimizerConfig(fused=False)
    )
    assert explanation.to_dict() == same.to_dict()
    lab = pnb.plan("fp16", "cpu", loss_scale_lab=True)
    assert lab.plan.use_scaler and lab.plan.device_type == "cpu"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"loss_scale_lab": 1}, "loss_scale_lab"), ({"fused": "yes"}, "fused"),
     ({"precision": "fp8"}, "fp8"), ({"fused": True, "optimizer": pnb.OptimizerConfig()}, "both")],
)  # fmt: skip
def test_pnb_plan_refuses_bad_input_by_name(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        pnb.plan(**kwargs)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    ("mode", "simulate", "lab"),
    [("fp16", None, True), ("bf16-true", None, False), ("fp16", "cuda-bf16", False)],
)
def test_every_written_line_fits_100_characters(framework, mode, simulate, lab):
    """The loss-scale lab's note, a true plan's cast and the rest fold at 100 characters, in
    every framework (the frameworks' names differ in length, so each is checked)."""
    code = pnb.plan(mode, simulate=simulate, loss_scale_lab=lab).code(framework)
    long = [line for line in code.splitlines() if len(line) > 100]
    assert not long, long
