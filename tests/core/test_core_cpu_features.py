"""CPU low-precision features: each source parsed, the first that answers named."""

from __future__ import annotations

import torch

from precision_nb.core import cpu_features as cf
from precision_nb.core.capabilities import get_capabilities, read_capabilities


def test_proc_cpuinfo_flags_are_parsed(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile\n")
    got = cf._from_proc(path)
    assert got == {
        "avx512_bf16": True,
        "amx_bf16": False,
        "avx512_fp16": False,
        "amx_fp16": False,
    }


def test_arm_linux_features_line(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("Features\t: fp asimd bf16 i8mm\n")
    assert cf._from_proc(path)["arm_bf16"] is True


def test_missing_proc_file_does_not_answer(tmp_path):
    assert cf._from_proc(tmp_path / "absent") is None


def test_torch_query_answers_first_and_is_named(monkeypatch):
    fake = {"avx512_bf16": False, "amx_bf16": True, "avx512_fp16": True, "amx_fp16": False}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {**fake, "cpu_name": "X"})
    got = cf.read_cpu_features(refresh=True)
    try:
        assert got.source == "torch.cpu.get_capabilities()"
        assert (got.avx512_bf16, got.amx_bf16, got.avx512_fp16) == (False, True, True)
        assert got.native_bf16 is True and got.native_fp16 is True
        assert got.cpu_name == "X"
        assert "AMX-BF16 yes" in got.summary() and "AVX512-BF16 no" in got.summary()
    finally:
        monkeypatch.undo()
        cf.read_cpu_features(refresh=True)


def test_falls_back_to_proc_when_torch_has_no_query(monkeypatch, tmp_path):
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    monkeypatch.setattr(cf.platform, "system", lambda: "Linux")
    path = tmp_path / "cpuinfo"
    path.write_text("flags : avx512_fp16\n")
    real = cf._from_proc
    monkeypatch.setattr(cf, "_from_proc", lambda: real(path))
    got = cf.read_cpu_features(refresh=True)
    try:
        assert got.source == "/proc/cpuinfo flags"
        assert got.avx512_fp16 is True and got.native_bf16 is False
    finally:
        monkeypatch.undo()
        cf.read_cpu_features(refresh=True)


def test_vector_isa_never_decides_bf16(monkeypatch):
    # torch's dispatch level says nothing about BF16: a CPU reported as "AVX2" with avx512_bf16
    # in its features still has native BF16.
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": True})
    got = cf.read_cpu_features(refresh=True)
    try:
        assert got.vector_isa == "AVX2" and got.native_bf16 is True
    finally:
        monkeypatch.undo()
        cf.read_cpu_features(refresh=True)


def test_no_source_leaves_features_unknown(monkeypatch):
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    monkeypatch.setattr(cf.platform, "system", lambda: "Windows")
    got = cf.read_cpu_features(refresh=True)
    try:
        assert got.native_bf16 is None and got.source.startswith("none")
        assert "AVX512-BF16 unknown" in got.summary()
    finally:
        monkeypatch.undo()
        cf.read_cpu_features(refresh=True)


def test_capabilities_carry_cpu_features():
    caps = read_capabilities()
    assert caps.cpu is not None and caps.cpu.source != ""
    assert "cpu" in caps.to_dict()
    assert get_capabilities("cuda-bf16").cpu is None  # simulated: no CPU facts invented
