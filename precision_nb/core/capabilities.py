"""What the hardware offers, read from torch at call time or simulated from a named preset.

Resolution takes a :class:`Capabilities` value, so anyone can see the plan for hardware they do
not have ("what would an A100 give me? a T4? a Mac?") and tests can cover every matrix row.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType
from typing import Any

import torch

from precision_nb.core.cpu_features import CpuFeatures, read_cpu_features
from precision_nb.core.validate import short_repr

logger = logging.getLogger(__name__)

#: Values of ``Capabilities.cuda_bf16``: the answer of ``torch.cuda.is_bf16_supported()``.
BF16_QUERY_RESULTS = ("supported", "unsupported", "error")

#: FP8 tensor-core matmuls (``torch._scaled_mm``) need compute capability 8.9 (Ada) or newer.
FP8_MIN_COMPUTE_CAPABILITY: tuple[int, int] = (8, 9)

#: Errors a capability query may raise (a CPU-only build raises AssertionError for CUDA calls).
_QUERY_ERRORS = (RuntimeError, AssertionError, TypeError, ValueError, AttributeError)


@dataclass(frozen=True)
class Capabilities:
    """What a machine offers for precision resolution.

    ``cuda_bf16`` is the query the resolution rules decide by, ``torch.cuda.is_bf16_supported()``:
    "supported", "unsupported" or "error" (the query raised). That query counts emulation (it is
    true on a T4), so ``cuda_bf16_native`` records separately whether BF16 is native (compute
    capability >= 8.0); ``None`` means it could not be told. ``cuda_device_count`` is ``None``
    when unknown.
    ``cpu`` holds what the CPU has for low precision (:mod:`precision_nb.core.cpu_features`).
    """

    name: str
    simulated: bool
    cuda_available: bool
    cuda_bf16: str = "unsupported"
    cuda_bf16_native: bool | None = None
    mps_available: bool = False
    cuda_device_count: int | None = 0
    device_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    cuda_bf16_error: str | None = None
    description: str = ""
    #: Low-precision CPU features (AVX512-BF16, AMX, ...) with their source; None when simulated
    #: without CPU facts.
    cpu: CpuFeatures | None = None

    def __post_init__(self) -> None:
        if self.cuda_bf16 not in BF16_QUERY_RESULTS:
            raise ValueError(
                f"capabilities.cuda_bf16: invalid value {self.cuda_bf16!r}; "
                f"allowed: {', '.join(map(repr, BF16_QUERY_RESULTS))}"
            )

    @property
    def bf16_emulated(self) -> bool:
        """True when the BF16 query says yes but the hardware has no native BF16."""
        return self.cuda_bf16 == "supported" and self.cuda_bf16_native is False

    @property
    def fp8_matmul(self) -> bool | None:
        """True when the CUDA device runs FP8 matmuls (compute capability >= 8.9), False when
        it does not (or there is no CUDA), ``None`` when CUDA is there but its capability unknown.
        """
        if not self.cuda_available:
            return False
        if self.compute_capability is None:
            return None
        return tuple(self.compute_capability) >= FP8_MIN_COMPUTE_CAPABILITY

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.compute_capability is not None:
            data["compute_capability"] = list(self.compute_capability)
        return data


def read_capabilities() -> Capabilities:
    """Read the capabilities of this machine from torch, now (tests may patch ``torch.cuda``)."""
    cuda = bool(torch.cuda.is_available())
    mps_backend = getattr(torch.backends, "mps", None)
    mps = bool(mps_backend is not None and mps_backend.is_available())
    count: int | None = 0
    name: str | None = None
    cc: tuple[int, int] | None = None
    native: bool | None = None
    if cuda:
        try:  # a count of 0 while is_available() says yes: leave it unknown
            count = int(torch.cuda.device_count()) or None
        except _QUERY_ERRORS:
            count = None
        try:
            name = str(torch.cuda.get_device_name(0))
            major, minor = torch.cuda.get_device_capability(0)
            cc = (int(major), int(minor))
        except _QUERY_ERRORS as exc:
            logger.debug("CUDA device properties unavailable: %s", exc)
    # torch's own query answers False without CUDA; asking it always keeps resolution faithful
    # to torch.cuda.is_bf16_supported() (the spec's deciding call) even when only it is patched.
    bf16_error: str | None = None
    try:
        bf16 = "supported" if torch.cuda.is_bf16_supported() else "unsupported"
    except _QUERY_ERRORS as exc:
        bf16, bf16_error = "error", f"{type(exc).__name__}: {exc}"
    if bf16 == "supported" and cc is not None:
        native = cc >= (8, 0)
    elif bf16 == "supported":
        try:
            native = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except _QUERY_ERRORS:
            # Older torch has no including_emulation argument; without a compute capability the
            # native question stays open and the explanation says so.
            native = None
    elif bf16 == "unsupported":
        native = False
    parts = [f"CUDA x{count or '?'} ({name or 'unknown device'})" if cuda else "no CUDA"]
    parts.append("MPS" if mps else "no MPS")
    return Capabilities(
        name="this-machine",
        simulated=False,
        cuda_available=cuda,
        cuda_bf16=bf16,
        cuda_bf16_native=native,
        mps_available=mps,
        cuda_device_count=count,
        device_name=name,
        compute_capability=cc,
        cuda_bf16_error=bf16_error,
        description="This machine, read from torch: " + ", ".join(parts),
        cpu=read_cpu_features(),
    )


#: What the simulated CUDA machines share: one device, native BF16 unless a preset says otherwise.
_ONE_GPU = Capabilities(
    name="",
    simulated=True,
    cuda_available=True,
    cuda_bf16="supported",
    cuda_bf16_native=True,
    cuda_device_count=1,
)
_SIMULATED: dict[str, Capabilities] = {
    "cpu-only": Capabilities(
        name="cpu-only",
        simulated=True,
        cuda_available=False,
        description="CPU only: no CUDA, no MPS",
    ),
    "cuda-bf16": replace(
        _ONE_GPU,
        name="cuda-bf16",
        device_name="NVIDIA A100-SXM4-80GB",
        compute_capability=(8, 0),
        description="CUDA with native BF16 (Ampere/Hopper class, e.g. A100, H100)",
    ),
    "cuda-fp8": replace(
        _ONE_GPU,
        name="cuda-fp8",
        device_name="NVIDIA H100 80GB HBM3",
        compute_capability=(9, 0),
        description="H100 class: CUDA with native BF16 and FP8 matmuls (compute capability 9.0)",
    ),
    "cuda-bf16-emulated": replace(
        _ONE_GPU,
        name="cuda-bf16-emulated",
        cuda_bf16_native=False,
        device_name="Tesla T4",
        compute_capability=(7, 5),
        description="CUDA whose BF16 query says yes through emulation only (Turing class, T4)",
    ),
    "cuda-no-bf16": replace(
        _ONE_GPU,
        name="cuda-no-bf16",
        cuda_bf16="unsupported",
        cuda_bf16_native=False,
        device_name="Tesla V100-SXM2-16GB",
        compute_capability=(7, 0),
        description="CUDA whose BF16 query says no (Volta/Turing class with an older torch)",
    ),
    "cuda-bf16-error": replace(
        _ONE_GPU,
        name="cuda-bf16-error",
        cuda_bf16="error",
        cuda_bf16_native=None,
        device_name="CUDA device (BF16 query raises)",
        cuda_bf16_error="RuntimeError: simulated failure of torch.cuda.is_bf16_supported()",
        description="CUDA whose BF16 query raises (a broken driver or runtime)",
    ),
    "mps": Capabilities(
        name="mps",
        simulated=True,
        cuda_available=False,
        mps_available=True,
        device_name="Apple M-series GPU",
        description="Apple Silicon Mac with the MPS backend",
    ),
}

#: Preset names -> one-line description. "this-machine" reads torch when asked for.
PRESETS: MappingProxyType[str, str] = MappingProxyType(
    {"this-machine": "This machine, read from torch when resolved"}
    | {name: caps.description for name, caps in _SIMULATED.items()}
)


def get_capabilities(preset: str | Capabilities | None = None) -> Capabilities:
    """Capabilities of a named preset, or of this machine for ``None`` / "this-machine".

    A :class:`Capabilities` value is returned as it is. Unknown names raise ``ValueError``
    listing the presets.
    """
    if isinstance(preset, Capabilities):
        return preset
    if preset is None:
        return read_capabilities()
    if isinstance(preset, str):
        key = preset.strip().lower()
        if key == "this-machine":
            return read_capabilities()
        if key in _SIMULATED:
            return replace(_SIMULATED[key])
    raise ValueError(
        f"capabilities preset: invalid value {short_repr(preset)}; allowed: "
        + ", ".join(repr(name) for name in PRESETS)
    )
