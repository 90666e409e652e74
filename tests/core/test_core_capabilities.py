"""Capabilities read from torch (patched) and the simulated presets."""

from __future__ import annotations

import pytest
import torch

from precision_nb import PRESETS, Capabilities, get_capabilities, read_capabilities


def test_every_preset_builds_and_says_what_it_is():
    assert "this-machine" in PRESETS
    for name, description in PRESETS.items():
        caps = get_capabilities(name)
        assert isinstance(caps, Capabilities) and description
        assert caps.simulated is (name != "this-machine")


@pytest.mark.parametrize(
    "name,cuda,bf16,native,mps",
    [
        ("cpu-only", False, "unsupported", None, False),
        ("cuda-bf16", True, "supported", True, False),
        ("cuda-bf16-emulated", True, "supported", False, False),
        ("cuda-no-bf16", True, "unsupported", False, False),
        ("cuda-bf16-error", True, "error", None, False),
        ("mps", False, "unsupported", None, True),
    ],
)
def test_presets_describe_their_hardware(name, cuda, bf16, native, mps):
    caps = get_capabilities(name)
    assert (caps.cuda_available, caps.cuda_bf16, caps.cuda_bf16_native, caps.mps_available) == (
        cuda,
        bf16,
        native,
        mps,
    )


def test_emulated_preset_is_turing_class():
    t4 = get_capabilities("cuda-bf16-emulated")
    assert t4.compute_capability == (7, 5) and t4.bf16_emulated
    assert not get_capabilities("cuda-bf16").bf16_emulated


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ValueError, match=r"'a100'.*'cuda-bf16'.*'mps'"):
        get_capabilities("a100")


def test_preset_names_accept_case_and_space():
    assert get_capabilities(" CUDA-BF16 ").name == "cuda-bf16"


def test_read_capabilities_cpu_machine(fake_torch):
    fake_torch(cuda=False, mps=False)
    caps = read_capabilities()
    assert not caps.cuda_available and not caps.mps_available and not caps.simulated
    assert caps.cuda_bf16 == "unsupported"


def test_read_capabilities_records_a_raising_bf16_query(fake_torch):
    fake_torch(cuda=True, bf16=RuntimeError("driver too old"))
    caps = read_capabilities()
    assert caps.cuda_available and caps.cuda_bf16 == "error"
    assert "driver too old" in (caps.cuda_bf16_error or "")


def test_native_bf16_from_compute_capability(fake_torch, monkeypatch):
    fake_torch(cuda=True, bf16=True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (7, 5))
    t4 = read_capabilities()
    assert (t4.cuda_bf16, t4.cuda_bf16_native, t4.cuda_device_count) == ("supported", False, 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    assert read_capabilities().cuda_bf16_native is True


def test_native_bf16_from_including_emulation_when_capability_unknown(fake_torch, monkeypatch):
    fake_torch(cuda=True)
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation
    )
    caps = read_capabilities()
    assert caps.cuda_bf16 == "supported" and caps.cuda_bf16_native is False


def test_bad_bf16_value_is_rejected():
    with pytest.raises(ValueError, match="cuda_bf16"):
        Capabilities(name="x", simulated=True, cuda_available=True, cuda_bf16="maybe")


def test_h100_class_preset_flags_fp8_from_its_compute_capability():
    h100 = get_capabilities("cuda-fp8")
    assert h100.simulated and h100.compute_capability == (9, 0) and h100.fp8_matmul is True
    assert h100.cuda_bf16 == "supported" and h100.cuda_bf16_native is True
    assert get_capabilities("cuda-bf16").fp8_matmul is False  # A100: 8.0 < 8.9
    assert get_capabilities("cpu-only").fp8_matmul is False
    assert get_capabilities("cuda-bf16-error").fp8_matmul is None  # capability unknown
    ada = Capabilities("ada", True, True, compute_capability=(8, 9))
    assert ada.fp8_matmul is True
