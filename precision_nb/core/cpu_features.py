"""What this CPU really has for low precision: AVX512-BF16, AMX-BF16, AVX512-FP16 and AMX-FP16 on
x86; on ARM the BF16 extension and ARMv8.2 half-precision arithmetic (FP16, native on every Apple
M-series and on AWS Graviton2 and newer, absent on ARMv8.0 cores such as the Cortex-A72).

Sources, first that answers wins (the answer says which):

1. torch's own query, ``torch.cpu.get_capabilities()`` (cpuinfo, read at run time), where the
   installed torch has it (on ARM its ``fp16_arith`` and ``bf16`` keys);
2. ``/proc/cpuinfo`` on Linux: the x86 ``flags`` line, or ARM's ``Features`` line (``asimdhp``:
   Advanced SIMD half-precision arithmetic; ``bf16``);
3. ``sysctl hw.optional.arm.FEAT_FP16 hw.optional.arm.FEAT_BF16`` on macOS (older macOS:
   ``hw.optional.neon_fp16``); Apple Silicon has no AVX/AMX.

``torch.backends.cpu.get_cpu_capability()`` names the vector ISA torch's kernels were dispatched
to (e.g. "AVX512"); it says nothing about BF16 or FP16 support and is never used to conclude that
a feature is missing.
"""

from __future__ import annotations

import logging
import platform
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The x86 features: each name is also its torch.cpu.get_capabilities() key and /proc/cpuinfo flag.
FEATURES: tuple[str, ...] = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")

#: macOS sysctl keys -> feature, in order of preference (Apple Silicon: no AVX512/AMX there).
SYSCTL: Mapping[str, str] = {
    "hw.optional.arm.FEAT_BF16": "arm_bf16",
    "hw.optional.arm.FEAT_FP16": "arm_fp16",
    "hw.optional.neon_fp16": "arm_fp16",  # the name before macOS 12
}
#: ARM Linux ``Features`` flags -> feature.
ARM_FLAGS: Mapping[str, str] = {"asimdhp": "arm_fp16", "bf16": "arm_bf16"}
#: ``torch.cpu.get_capabilities()`` keys on ARM -> feature.
ARM_TORCH: Mapping[str, str] = {"fp16_arith": "arm_fp16", "bf16": "arm_bf16"}


@dataclass(frozen=True)
class CpuFeatures:
    """Low-precision CPU features (None: the source could not tell) and the source that answered;
    ``vector_isa`` is shown for completeness (module docstring)."""

    avx512_bf16: bool | None = None
    amx_bf16: bool | None = None
    avx512_fp16: bool | None = None
    amx_fp16: bool | None = None
    arm_bf16: bool | None = None
    arm_fp16: bool | None = None
    cpu_name: str | None = None
    vector_isa: str | None = None
    source: str = "none"

    @property
    def native_bf16(self) -> bool | None:
        """True when any BF16 instruction set is present; None when nothing could be read."""
        values = (self.avx512_bf16, self.amx_bf16, self.arm_bf16)
        return True if True in values else (False if False in values else None)

    @property
    def native_fp16(self) -> bool | None:
        """True when any FP16 arithmetic instruction set is present (x86 AVX512-FP16 / AMX-FP16,
        ARMv8.2 FP16); None when nothing could be read."""
        values = (self.avx512_fp16, self.amx_fp16, self.arm_fp16)
        return True if True in values else (False if False in values else None)

    @property
    def is_arm(self) -> bool:
        return self.arm_bf16 is not None or self.arm_fp16 is not None

    def instruction_names(self, mode: str) -> str:
        """The instruction sets that would make ``mode`` ("bf16" / "fp16") native on this CPU."""
        if self.is_arm:
            return "ARM BF16 (FEAT_BF16)" if mode == "bf16" else "ARMv8.2 FP16 (FEAT_FP16)"
        return "AVX512-BF16 / AMX-BF16" if mode == "bf16" else "AVX512-FP16 / AMX-FP16"

    def summary(self) -> str:
        """One line, e.g. "AVX512-BF16 yes, AMX-BF16 no, ... (source: torch.cpu...)"."""
        words = {True: "yes", False: "no", None: "unknown"}
        shown = ("arm_bf16", "arm_fp16") if self.is_arm else FEATURES
        sep = " " if self.is_arm else "-"  # "ARM BF16", "AVX512-BF16"
        parts = [f"{key.upper().replace('_', sep)} {words[getattr(self, key)]}" for key in shown]
        return ", ".join(parts) + f" (source: {self.source})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _from_torch() -> dict[str, bool] | None:
    import torch

    query: Callable[[], Mapping[str, Any]] | None = getattr(torch.cpu, "get_capabilities", None)
    if query is None:
        return None
    try:
        caps = query()
    except (RuntimeError, OSError) as exc:
        log.info("torch.cpu.get_capabilities() failed: %s", exc)
        return None
    if any(key in caps for key in ARM_TORCH):
        arm = {name: bool(caps.get(key, False)) for key, name in ARM_TORCH.items()}
        return {**arm, **{name: False for name in FEATURES}}  # no AVX512 / AMX on ARM
    if not any(key in caps for key in FEATURES):
        return None  # neither an x86 nor an ARM answer: let the OS say
    return {name: bool(caps.get(name, False)) for name in FEATURES}


def parse_cpuinfo(text: str) -> dict[str, bool] | None:
    """Features from the text of ``/proc/cpuinfo`` (its first ``flags`` or ``Features`` line)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags = set(value.split())
            out = {name: name in flags for name in FEATURES}
            if key.strip() == "Features":  # ARM Linux
                out.update({name: flag in flags for flag, name in ARM_FLAGS.items()})
            return out
    return None


def _from_proc(path: Path = Path("/proc/cpuinfo")) -> dict[str, bool] | None:
    try:
        return parse_cpuinfo(path.read_text())
    except OSError:
        return None


def parse_sysctl(text: str) -> dict[str, bool] | None:
    """Features from ``sysctl`` output lines ``key: value`` (a key macOS lacks is left out;
    ``FEAT_FP16`` is preferred to the older ``neon_fp16``)."""
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in SYSCTL and value.strip():
            values[key.strip()] = value.strip() == "1"
    out: dict[str, bool] = {}
    for key, name in SYSCTL.items():
        if key in values and name not in out:
            out[name] = values[key]
    if not out:
        return None
    out.update({name: False for name in FEATURES})  # Apple Silicon has no AVX512 / AMX
    return out


def _from_sysctl() -> dict[str, bool] | None:
    try:
        done = subprocess.run(
            ["sysctl", *SYSCTL], capture_output=True, text=True, timeout=2, check=False
        )  # a key this macOS lacks goes to stderr; the others are still printed
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_sysctl(done.stdout)


def _cpu_name() -> str | None:
    import torch

    query = getattr(torch.cpu, "get_capabilities", None)
    if query is not None:
        try:
            name = query().get("cpu_name")
        except (RuntimeError, OSError):
            name = None
        if name:
            return str(name)
    return platform.processor() or None


_CACHE: list[CpuFeatures] = []


def read_cpu_features(refresh: bool = False) -> CpuFeatures:
    """This CPU's low-precision features, read once per process (``refresh`` reads again)."""
    if _CACHE and not refresh:
        return _CACHE[0]
    import torch

    sources: list[tuple[str, Callable[[], dict[str, bool] | None]]] = [
        ("torch.cpu.get_capabilities()", _from_torch)
    ]
    system = platform.system()
    if system == "Linux":
        sources.append(("/proc/cpuinfo flags", _from_proc))
    elif system == "Darwin":
        sources.append(("sysctl hw.optional", _from_sysctl))
    found: dict[str, bool] = {}
    source = "none (no source answered)"
    for name, read in sources:
        answer = read()
        if answer is not None:
            found, source = answer, name
            break
    isa = torch.backends.cpu.get_cpu_capability()
    features = CpuFeatures(
        **{k: found.get(k) for k in (*FEATURES, "arm_bf16", "arm_fp16")},
        cpu_name=_cpu_name(),
        vector_isa=str(isa) if isa else None,
        source=source,
    )
    _CACHE[:] = [features]
    return features
