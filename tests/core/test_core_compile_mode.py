"""The compile request: names, resolution per device with a reason read from torch, refusals, and
the compile decision in the plan explanation. Nothing here compiles a model."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

import precision_nb as pnb
from precision_nb.core import compile_mode
from precision_nb.core.capabilities import get_capabilities
from precision_nb.core.compile_mode import (
    COMPILE_MODES,
    CompilePlan,
    CompileSupport,
    read_compile_support,
    resolve_compile,
)
from precision_nb.core.names import compile_list, compile_name

MODES = (
    ("default", ()),
    ("reduce-overhead", (("triton.cudagraphs", "True"),)),
    ("max-autotune", (("max_autotune", "True"), ("triton.cudagraphs", "True"))),
)


def support(**changes) -> CompileSupport:
    base = CompileSupport(
        torch_version="9.9",
        dynamo_error=None,
        modes=MODES,
        cxx_candidates=("g++",),
        cxx="/usr/bin/g++",
        triton=True,
        codegen_devices=("cpu", "cuda", "mps"),
        gemm_backends="ATEN,TRITON,CPP",
    )
    return dataclasses.replace(base, **changes)


HERE = get_capabilities("cpu-only")
REAL = dataclasses.replace(HERE, simulated=False, name="this-machine")


@pytest.mark.parametrize(
    ("typed", "name"),
    [
        ("off", "off"),
        (" Default ", "default"),
        ("REDUCE-OVERHEAD", "reduce-overhead"),
        ("max-autotune", "max-autotune"),
        (None, "off"),
        (False, "off"),
        (True, "default"),
    ],
)
def test_compile_names_accept_what_users_type(typed, name):
    assert compile_name(typed) == name


@pytest.mark.parametrize("bad", ["fast", "max_autotune", 1, 0, "", "inductor"])
def test_bad_compile_names_name_field_value_and_allowed(bad):
    with pytest.raises(ValueError) as err:
        compile_name(bad, "compile")
    text = str(err.value)
    assert text.startswith("compile: invalid value")
    assert repr(bad) in text
    for mode in COMPILE_MODES:
        assert repr(mode) in text


def test_compile_lists_refuse_empty_and_repeated_modes():
    assert compile_list("off, default") == ["off", "default"]
    with pytest.raises(ValueError, match="--compile: invalid value ' , '"):
        compile_list(" , ")
    with pytest.raises(ValueError, match="default given twice"):
        compile_list("default,off,DEFAULT")


def test_off_reads_nothing_from_torch(monkeypatch):
    def boom():
        raise AssertionError("compile support read for an 'off' request")

    monkeypatch.setattr(compile_mode, "read_compile_support", boom)
    plan = resolve_compile("off", "cpu", REAL)
    assert not plan.enabled and plan.suffix == "" and plan.label("bf16") == "bf16"
    with pytest.raises(ValueError, match="nothing to pass torch.compile"):
        plan.torch_kwargs()


def test_default_on_cpu_names_the_compiler_and_the_options_torch_lists():
    plan = resolve_compile("default", "cpu", REAL, support())
    assert plan.enabled and not plan.fallback
    assert plan.torch_kwargs() == {"backend": "inductor", "mode": None}
    assert plan.label("bf16") == "bf16+compile"
    assert "/usr/bin/g++" in plan.codegen and "/usr/bin/g++" in plan.reason
    assert "sets no options" in plan.reason and "torch 9.9" in plan.reason


def test_reduce_overhead_off_cuda_is_a_fallback_that_says_cuda_graphs_are_skipped():
    plan = resolve_compile("reduce-overhead", "cpu", REAL, support())
    assert plan.fallback
    assert "CUDA graphs skipped" in plan.outcome
    assert "skips them" in plan.reason and "triton.cudagraphs=True" in plan.reason
    assert plan.label("fp32") == "fp32+compile:reduce-overhead"
    assert plan.torch_kwargs()["mode"] == "reduce-overhead"


def test_reduce_overhead_on_cuda_explains_cuda_graphs_without_fallback():
    plan = resolve_compile("reduce-overhead", "cuda", REAL, support())
    assert not plan.fallback
    assert "recorded once and replayed" in plan.reason


def test_max_autotune_says_what_it_chooses_from():
    plan = resolve_compile(
        "max-autotune", "cpu", REAL, support(gemm_backends="ATEN,CPP", conv_backends="ATEN")
    )
    assert "each matmul (from ATEN,CPP) and convolution (from ATEN)" in plan.reason
    assert plan.fallback


def test_the_backends_are_read_from_torch_s_inductor_config():
    from torch._inductor import config

    from precision_nb.core.compile_mode import read_compile_support

    got = read_compile_support()
    assert got.gemm_backends == config.max_autotune_gemm_backends
    assert got.conv_backends == config.max_autotune_conv_backends


def test_cpu_without_a_cxx_compiler_is_refused_naming_what_to_install():
    with pytest.raises(RuntimeError) as err:
        resolve_compile("default", "cpu", REAL, support(cxx=None, cxx_candidates=("g++",)))
    text = str(err.value)
    assert "compile: 'default' cannot run on cpu" in text
    assert "torch._inductor.config.cpp.cxx tries: g++" in text
    assert "apt-get install g++" in text and "compile='off'" in text


def test_cuda_without_triton_is_refused():
    with pytest.raises(RuntimeError, match="Triton is not installed"):
        resolve_compile("default", "cuda", REAL, support(triton=False))


def test_unsupported_dynamo_and_unlisted_modes_are_refused_with_torch_reason():
    with pytest.raises(RuntimeError, match="not supported.*Python 3.99"):
        resolve_compile("default", "cpu", REAL, support(dynamo_error="RuntimeError: Python 3.99"))
    with pytest.raises(RuntimeError, match="offers default; use one of those"):
        resolve_compile("max-autotune", "cpu", REAL, support(modes=MODES[:1]))


def test_a_device_without_an_inductor_code_generator_is_refused():
    with pytest.raises(RuntimeError, match="no code generator for 'mps'"):
        resolve_compile("default", "mps", REAL, support(codegen_devices=("cpu",)))


@pytest.mark.parametrize("preset", ["cuda-bf16", "cuda-bf16-emulated", "mps"])
def test_simulated_hardware_is_explained_never_refused(preset):
    caps = get_capabilities(preset)
    device = "mps" if preset == "mps" else "cuda"
    plan = resolve_compile(
        "reduce-overhead", device, caps, support(triton=False, codegen_devices=("cpu", "cuda"))
    )
    assert plan.simulated and plan.enabled
    assert "simulated" in plan.reason and "not checked" in plan.reason
    assert plan.fallback == (device != "cuda")


def test_simulated_cpu_does_not_claim_this_machines_compiler_for_that_one():
    plan = resolve_compile("default", "cpu", HERE, support())
    assert plan.codegen == "C++"
    assert "this machine has /usr/bin/g++" in plan.reason


# --------------------------------------------------------------------------- real torch


def test_this_torch_offers_the_modes_and_cuda_graph_option_the_resolution_describes():
    found = read_compile_support()
    assert found.dynamo_error is None
    for mode in COMPILE_MODES[1:]:
        assert mode in found.mode_names
    assert found.options("reduce-overhead").get("triton.cudagraphs") == "True"
    assert found.options("max-autotune").get("max_autotune") == "True"
    assert "cpu" in found.codegen_devices
    expected = next((shutil.which(c) for c in found.cxx_candidates if shutil.which(c)), None)
    assert found.cxx == expected


def test_a_missing_compiler_in_torchs_own_config_is_refused():
    import torch._inductor.config as inductor_config

    before = read_compile_support().cxx
    with inductor_config.patch({"cpp.cxx": (None, "no-such-cxx-precision-nb")}):
        with pytest.raises(RuntimeError, match="tries: no-such-cxx-precision-nb"):
            pnb.plan("fp32", "cpu", compile="default")
    assert read_compile_support().cxx == before  # torch's own config is restored


# --------------------------------------------------------------------------- the explanation


def test_the_explanation_carries_the_compile_decision_last():
    e = pnb.plan("bf16", "cpu", compile="reduce-overhead")
    last = e.decisions[-1]
    assert last.field == "compile" and last.fallback
    assert "autocast (bf16) is entered outside it" in last.reason
    assert e.label == "bf16+compile:reduce-overhead"
    assert e.summary().endswith("compile: reduce-overhead")
    assert "compile" in str(e) and "compile" in e._repr_html_()
    assert e.to_dict()["compile"]["mode"] == "reduce-overhead"


def test_a_scaler_plan_says_its_scaler_stays_outside_the_compiled_model():
    e = pnb.plan("fp16", "cpu", compile="default", loss_scale_lab=True)
    assert "GradScaler (scale, unscale, step, update) runs eagerly" in e.decisions[-1].reason


def test_compile_off_leaves_the_explanation_as_it_was():
    e = pnb.plan("bf16", "cpu")
    assert [d.field for d in e.decisions][-1] == "fused AdamW"
    assert e.compile == CompilePlan(device_type="cpu")
    assert "compile" not in e.summary() and e.label == "bf16"


def test_a_bad_compile_request_is_refused_by_plan():
    with pytest.raises(ValueError, match="compile: invalid value 'fastest'"):
        pnb.plan("bf16", "cpu", compile="fastest")


def test_a_simulated_gpu_plan_explains_the_compile_there():
    e = pnb.plan("bf16", "cuda", simulate="cuda-bf16", compile="max-autotune")
    assert e.compile.simulated and not e.compile.fallback
    assert "recorded once and replayed" in e.decisions[-1].reason
