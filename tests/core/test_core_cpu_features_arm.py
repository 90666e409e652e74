"""ARM CPUs: native fp16 (ARMv8.2 half-precision arithmetic) and bf16, read from the recorded
outputs of real machines: /proc/cpuinfo of AWS Graviton2 (Neoverse N1), Graviton3 (Neoverse V1)
and an ARMv8.0 Cortex-A53 without FP16; ``sysctl`` of an Apple M1 (FP16, no BF16) and an M2
(both); and torch's own query on ARM."""

from __future__ import annotations

import torch

from precision_nb.core import cpu_features as cf
from precision_nb.core.resolution import explain_precision

#: AWS Graviton2 (c6g), Neoverse N1: ARMv8.2 with FP16 (asimdhp), no BF16.
GRAVITON2 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""  # noqa: E501
#: AWS Graviton3 (c7g), Neoverse V1: FP16 and BF16.
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd40
CPU revision\t: 1
"""  # noqa: E501
#: Rockchip RK3399's Cortex-A53 cores: ARMv8.0, no half-precision arithmetic.
CORTEX_A53 = """processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd03
CPU revision\t: 4
"""
#: ``sysctl hw.optional.arm.FEAT_BF16 hw.optional.arm.FEAT_FP16 hw.optional.neon_fp16`` on an
#: Apple M1 (macOS 13) and an M2: lines as ``sysctl hw.optional`` prints them.
APPLE_M1 = """hw.optional.arm.FEAT_BF16: 0
hw.optional.arm.FEAT_FP16: 1
hw.optional.neon_fp16: 1
"""
APPLE_M2 = """hw.optional.arm.FEAT_BF16: 1
hw.optional.arm.FEAT_FP16: 1
hw.optional.neon_fp16: 1
"""
#: An M1 on macOS 11 has no FEAT_* keys: only the older name answers.
APPLE_M1_MACOS_11 = "hw.optional.neon_fp16: 1\n"


def test_graviton2_has_native_fp16_and_no_bf16():
    got = cf.CpuFeatures(**cf.parse_cpuinfo(GRAVITON2))
    assert got.native_fp16 is True and got.native_bf16 is False
    assert got.summary() == "ARM BF16 no, ARM FP16 yes (source: none)"


def test_graviton3_has_both():
    got = cf.CpuFeatures(**cf.parse_cpuinfo(GRAVITON3))
    assert got.native_fp16 is True and got.native_bf16 is True


def test_an_armv8_0_core_has_neither():
    got = cf.CpuFeatures(**cf.parse_cpuinfo(CORTEX_A53))
    assert got.native_fp16 is False and got.native_bf16 is False


def test_apple_m1_and_m2_from_sysctl():
    m1 = cf.CpuFeatures(**cf.parse_sysctl(APPLE_M1))
    assert m1.native_fp16 is True and m1.native_bf16 is False
    m2 = cf.CpuFeatures(**cf.parse_sysctl(APPLE_M2))
    assert m2.native_fp16 is True and m2.native_bf16 is True
    old = cf.CpuFeatures(**cf.parse_sysctl(APPLE_M1_MACOS_11))
    assert old.native_fp16 is True and old.arm_bf16 is None
    assert cf.parse_sysctl("sysctl: unknown oid 'hw.optional.arm.FEAT_FP16'\n") is None


def test_sysctl_is_asked_for_every_key_at_once(monkeypatch):
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        return type("Done", (), {"stdout": APPLE_M2, "returncode": 0})()

    monkeypatch.setattr(cf.subprocess, "run", run)
    assert cf._from_sysctl()["arm_fp16"] is True
    assert calls == [["sysctl", *cf.SYSCTL]]


def test_torch_s_arm_answer_is_read(monkeypatch):
    answer = {"architecture": "aarch64", "neon": True, "fp16_arith": True, "bf16": False}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: answer)
    try:
        got = cf.read_cpu_features(refresh=True)
        assert got.source == "torch.cpu.get_capabilities()"
        assert got.arm_fp16 is True and got.native_fp16 is True and got.native_bf16 is False
    finally:
        monkeypatch.undo()
        cf.read_cpu_features(refresh=True)


def test_an_fp16_request_on_a_graviton2_is_said_native_with_arm_names(monkeypatch):
    # the plan's text: on ARM it names the ARM extensions, not AVX512 / AMX
    answer = {"architecture": "aarch64", "fp16_arith": True, "bf16": False}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: answer)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "SVE256")
    try:
        cf.read_cpu_features(refresh=True)
        text = str(explain_precision("fp16", "cpu"))
        bf16 = str(explain_precision("bf16", "cpu"))
    finally:
        monkeypatch.undo()
        cf.read_cpu_features(refresh=True)
    assert "this CPU reports native instructions (ARMv8.2 FP16 (FEAT_FP16))" in text
    assert "AVX512" not in text and "no native" not in text
    assert "bf16: this CPU reports no native instructions (ARM BF16 (FEAT_BF16))" in bf16
