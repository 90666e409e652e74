"""What this CPU really has for low precision: AVX512-BF16, AMX-BF16, AVX512-FP16, AMX-FP16.

Sources, first that answers wins (the answer says which):

1. torch's own query, ``torch.cpu.get_capabilities()`` (cpuinfo, read at run time), where the
   installed torch has it;
2. the ``flags`` line of ``/proc/cpuinfo`` on Linux;
3. ``sysctl hw.optional.*`` on macOS (Apple Silicon reports ``arm.FEAT_BF16``; it has no AVX/AMX).

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

#: Feature name -> (torch.cpu.get_capabilities() key, /proc/cpuinfo flag).
FEATURES: Mapping[str, tuple[str, str]] = {
    "avx512_bf16": ("avx512_bf16", "avx512_bf16"),
    "amx_bf16": ("amx_bf16", "amx_bf16"),
    "avx512_fp16": ("avx512_fp16", "avx512_fp16"),
    "amx_fp16": ("amx_fp16", "amx_fp16"),
}

#: macOS sysctl keys -> feature (Apple Silicon: BF16 instructions; no AVX512/AMX there).
_SYSCTL: Mapping[str, str] = {"hw.optional.arm.FEAT_BF16": "arm_bf16"}


@dataclass(frozen=True)
class CpuFeatures:
    """Low-precision CPU features (None: the source could not tell) and the source that answered.

    ``vector_isa`` is ``torch.backends.cpu.get_cpu_capability()``: shown for completeness, it is
    the kernel dispatch level, not a list of BF16/FP16 features.
    """

    avx512_bf16: bool | None = None
    amx_bf16: bool | None = None
    avx512_fp16: bool | None = None
    amx_fp16: bool | None = None
    arm_bf16: bool | None = None
    cpu_name: str | None = None
    vector_isa: str | None = None
    source: str = "none"

    @property
    def native_bf16(self) -> bool | None:
        """True when any BF16 instruction set is present; None when nothing could be read."""
        values = [self.avx512_bf16, self.amx_bf16, self.arm_bf16]
        if any(v is True for v in values):
            return True
        return False if any(v is False for v in values) else None

    @property
    def native_fp16(self) -> bool | None:
        values = [self.avx512_fp16, self.amx_fp16]
        if any(v is True for v in values):
            return True
        return False if any(v is False for v in values) else None

    def summary(self) -> str:
        """One line, e.g. "AVX512-BF16 yes, AMX-BF16 no, ... (source: torch.cpu...)"."""
        names = {
            "avx512_bf16": "AVX512-BF16",
            "amx_bf16": "AMX-BF16",
            "avx512_fp16": "AVX512-FP16",
            "amx_fp16": "AMX-FP16",
            "arm_bf16": "ARM BF16",
        }
        words = {True: "yes", False: "no", None: "unknown"}
        parts = [
            f"{label} {words[getattr(self, key)]}"
            for key, label in names.items()
            if key != "arm_bf16" or self.arm_bf16 is not None
        ]
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
    if not any(key in caps for key, _ in FEATURES.values()):
        return None  # not an x86 answer (e.g. ARM): let the OS say
    return {name: bool(caps.get(key, False)) for name, (key, _) in FEATURES.items()}


def _from_proc(path: Path = Path("/proc/cpuinfo")) -> dict[str, bool] | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags = set(value.split())
            out = {name: flag in flags for name, (_, flag) in FEATURES.items()}
            if key.strip() == "Features":  # ARM Linux: bf16 in the Features line
                out["arm_bf16"] = "bf16" in flags
            return out
    return None


def _from_sysctl() -> dict[str, bool] | None:
    out: dict[str, bool] = {}
    for key, name in _SYSCTL.items():
        try:
            done = subprocess.run(
                ["sysctl", "-n", key], capture_output=True, text=True, timeout=2, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode == 0 and done.stdout.strip():
            out[name] = done.stdout.strip() == "1"
    if not out:
        return None
    out.update({name: False for name in FEATURES})  # Apple Silicon has no AVX512 / AMX
    return out


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
        **{k: found.get(k) for k in (*FEATURES, "arm_bf16")},
        cpu_name=_cpu_name(),
        vector_isa=str(isa) if isa else None,
        source=source,
    )
    _CACHE[:] = [features]
    return features
