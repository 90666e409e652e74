"""The compile request (``off``, ``default``, ``reduce-overhead``, ``max-autotune``) resolved on a
device, with a reason read from the running torch.

``compile="off"`` (the default) trains eagerly. The other values are ``torch.compile`` modes:
TorchDynamo captures the model's forward into graphs and the inductor backend generates code for
them (C++ on CPU, Triton on CUDA, Metal on MPS). :func:`read_compile_support` asks torch, now, what
it offers (:class:`CompileSupport`). :func:`resolve_compile` turns a request into a
:class:`CompilePlan` whose ``outcome``/``reason``/``fallback`` become the explanation's ``compile``
decision.

A request this machine cannot run raises ``RuntimeError`` naming what is missing, as absent hardware
does. ``reduce-overhead`` means CUDA graphs; on a CPU or MPS device inductor skips them (torch
counts the skip, and the engine shows torch's reason), so the plan is marked a fallback: it compiles
what ``default`` compiles. Simulated hardware is never refused: the reason says what that machine
would need and that it was not checked.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from precision_nb.core.capabilities import Capabilities
from precision_nb.core.names import COMPILE_MODES, compile_name

__all__ = [
    "COMPILE_MODES",
    "CompilePlan",
    "CompileSupport",
    "compile_name",
    "read_compile_support",
    "resolve_compile",
]

#: What each device's inductor code is written in (the code generator torch registers).
_CODEGEN_LANGUAGE = {"cpu": "C++", "cuda": "Triton", "mps": "Metal", "xpu": "Triton"}
#: Errors torch's compile queries may raise on an unusual build.
_QUERY_ERRORS = (ImportError, AttributeError, RuntimeError, TypeError, ValueError, KeyError)


@dataclass(frozen=True)
class CompileSupport:
    """What the running torch offers ``torch.compile``, read by :func:`read_compile_support`.

    ``dynamo_error``: None when TorchDynamo runs here, else torch's own reason.
    ``modes``: the modes ``torch.compile`` accepts, each with the inductor options it sets.
    ``cxx_candidates``: the compilers inductor tries on CPU, in order; ``cxx``: the first one
    found on ``PATH`` (its path), None when none is. ``triton``: Triton importable.
    ``codegen_devices``: device types with an inductor code generator registered.
    ``gemm_backends`` / ``conv_backends``: what ``max-autotune`` chooses matmul / convolution
    kernels from (``max_autotune_gemm_backends`` / ``max_autotune_conv_backends``).
    """

    torch_version: str
    dynamo_error: str | None
    modes: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    cxx_candidates: tuple[str, ...]
    cxx: str | None
    triton: bool
    codegen_devices: tuple[str, ...]
    gemm_backends: str = ""
    conv_backends: str = ""

    @property
    def mode_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.modes)

    def options(self, mode: str) -> dict[str, str]:
        """The inductor options ``mode`` sets, as torch lists them (empty for ``default``)."""
        return dict(dict(self.modes).get(mode, ()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "modes": {name: dict(opts) for name, opts in self.modes},
            "cxx_candidates": list(self.cxx_candidates),
            "codegen_devices": list(self.codegen_devices),
        }


def read_compile_support() -> CompileSupport:
    """Ask the running torch what ``torch.compile`` can do here (imports torch._dynamo and
    torch._inductor, about a second the first time; tests may patch what it reads)."""
    import torch

    error: str | None = None
    try:
        importlib.import_module("torch._dynamo.eval_frame").check_if_dynamo_supported()
    except _QUERY_ERRORS as exc:
        error = f"{type(exc).__name__}: {exc}"
    try:
        inductor = importlib.import_module("torch._inductor")
        listed: Mapping[str, Mapping[str, Any]] = inductor.list_mode_options()
        modes = (() if "default" in listed else (("default", ()),)) + tuple(
            (str(name), tuple((str(k), repr(v)) for k, v in sorted(options.items())))
            for name, options in listed.items()
        )
        config = importlib.import_module("torch._inductor.config")
        raw = config.cpp.cxx
        raw = raw if isinstance(raw, (list, tuple)) else (raw,)
        # None asks torch to install g++ through conda, which it does only when
        # TORCH_INDUCTOR_INSTALL_GXX is set; the named compilers are what it finds on PATH.
        candidates = tuple(str(c) for c in raw if c)
        gemm = str(getattr(config, "max_autotune_gemm_backends", ""))
        conv = str(getattr(config, "max_autotune_conv_backends", ""))
        codegen = importlib.import_module("torch._inductor.codegen.common")
        codegen.init_backend_registration()
        devices = tuple(
            d
            for d in ("cpu", "cuda", "mps", "xpu")
            if codegen.get_scheduling_for_device(d) is not None
        )
        triton_utils = importlib.import_module("torch.utils._triton")
        triton = bool(triton_utils.has_triton())
    except _QUERY_ERRORS as exc:
        error = error or f"torch._inductor could not be read: {type(exc).__name__}: {exc}"
        modes, candidates, gemm, conv, devices, triton = (), (), "", "", (), False
    return CompileSupport(
        torch_version=str(torch.__version__),
        dynamo_error=error,
        modes=modes,
        cxx_candidates=candidates,
        cxx=next(filter(None, map(shutil.which, candidates)), None),  # the first found on PATH
        triton=triton,
        codegen_devices=devices,
        gemm_backends=gemm,
        conv_backends=conv,
    )


@dataclass(frozen=True)
class CompilePlan:
    """What a compile request resolved to on one device.

    ``mode``: "off" (eager) or the mode passed to ``torch.compile``. ``backend``: "inductor" or
    None. ``codegen``: what inductor generates there, with the compiler when it is C++.
    ``outcome`` / ``reason`` / ``fallback``: the explanation's ``compile`` decision (``fallback``
    when the request is not honoured as asked: CUDA graphs skipped off CUDA). ``options``: the
    inductor options the mode sets, as torch lists them. ``simulated``: resolved for hardware that
    is not here (nothing on that machine was checked).
    """

    requested: str = "off"
    mode: str = "off"
    device_type: str = "cpu"
    backend: str | None = None
    codegen: str = ""
    outcome: str = "off (eager)"
    reason: str = "compile=off: eager execution, each op dispatched as it runs (the default)"
    fallback: bool = False
    options: tuple[tuple[str, str], ...] = ()
    simulated: bool = False
    torch_version: str = ""

    @property
    def enabled(self) -> bool:
        """True when the model is compiled."""
        return self.mode != "off"

    @property
    def suffix(self) -> str:
        """What a plan label gets: "" (eager), "+compile" or "+compile:<mode>"."""
        if not self.enabled:
            return ""
        return "+compile" if self.requested == "default" else f"+compile:{self.requested}"

    def label(self, precision: str) -> str:
        """The label of a plan compiled this way: ``bf16``, ``bf16+compile``,
        ``bf16+compile:max-autotune``."""
        return f"{precision}{self.suffix}"

    def torch_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``torch.compile`` for this plan (``mode=None`` for default)."""
        if not self.enabled:
            raise ValueError("compile: the plan is 'off'; there is nothing to pass torch.compile")
        return {"backend": "inductor", "mode": None if self.mode == "default" else self.mode}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"options": dict(self.options)}


def _mode_reason(mode: str, device: str, support: CompileSupport) -> tuple[str, bool]:
    """What ``mode`` does on ``device``, and whether that is a fallback from what was asked."""
    opts = support.options(mode)
    cudagraphs = opts.get("triton.cudagraphs") == "True"
    parts = [
        "TorchDynamo captures the forward (and AOTAutograd the backward) into graphs and "
        "inductor generates fused kernels for them; the first step pays the compile, later steps "
        "run the generated code"
    ]
    if opts.get("max_autotune") == "True":
        gemm = support.gemm_backends or "the backends torch lists"
        conv = support.conv_backends or "the backends torch lists"
        parts.append(
            "at compile time inductor benchmarks candidate kernels for each matmul (from "
            f"{gemm}) and convolution (from {conv}) and keeps the fastest: a longer first compile"
        )
    if cudagraphs and device == "cuda":
        parts.append(
            "CUDA graphs: the compiled step's kernel launches are recorded once and replayed, "
            "cutting per-step launch overhead (what helps small batches); they need unchanging "
            "input shapes and keep their own memory pool"
        )
    fallback = cudagraphs and device != "cuda"
    if fallback:
        parts.append(
            f"CUDA graphs record CUDA kernels only: on {device} inductor skips them (torch "
            "counts a cudagraph skip and logs why), so this plan compiles what mode 'default' "
            "compiles"
        )
    return "; ".join(parts), fallback


def resolve_compile(
    request: Any,
    device_type: str,
    capabilities: Capabilities | None = None,
    support: CompileSupport | None = None,
) -> CompilePlan:
    """Resolve a compile request for a device type ("cpu", "cuda", "mps").

    ``request``: a mode name (see :data:`COMPILE_MODES`), True ("default"), False/None ("off").
    ``capabilities``: the hardware resolved for (simulated hardware is explained, never refused).
    ``support``: what torch offers (:func:`read_compile_support` by default; read only when the
    request is not "off"). ``ValueError`` for a bad request; ``RuntimeError`` when this machine
    cannot compile it (the message names what is missing and how to get it).
    """
    requested = compile_name(request)
    if requested == "off":
        return CompilePlan(device_type=device_type)
    simulated = bool(capabilities is not None and capabilities.simulated)
    support = support if support is not None else read_compile_support()
    where = f"{device_type} ({capabilities.name}, simulated)" if simulated else device_type
    notes: list[str] = []

    def missing(what: str, here: str = "") -> None:
        # This machine: refuse, naming what is missing. Simulated: say what that machine needs.
        if not simulated:
            raise RuntimeError(f"compile: {requested!r} cannot run on {where}: {what}")
        notes.append(f"not checked on the simulated machine: {here or what}")

    if support.dynamo_error is not None:
        missing(
            f"TorchDynamo is not supported by torch {support.torch_version} here "
            f"({support.dynamo_error}); use compile='off'",
            f"TorchDynamo must run there (here: {support.dynamo_error})",
        )
    if requested not in support.mode_names:
        listed = ", ".join(support.mode_names) or "none"
        raise RuntimeError(
            f"compile: {requested!r} is not a mode of torch {support.torch_version}: "
            f"torch._inductor.list_mode_options() offers {listed}; use one of those or 'off'"
        )
    codegen = _CODEGEN_LANGUAGE.get(device_type, "code")
    if device_type not in support.codegen_devices:
        missing(
            f"inductor in torch {support.torch_version} registers no code generator for "
            f"{device_type!r} (it has {', '.join(support.codegen_devices) or 'none'}); use "
            "compile='off'"
        )
    if device_type == "cpu":
        tried = ", ".join(support.cxx_candidates) or "none configured"
        if support.cxx is None:
            missing(
                "inductor on CPU writes C++ and compiles it, and no C++ compiler was found on "
                f"PATH (torch._inductor.config.cpp.cxx tries: {tried}); install one (e.g. "
                "apt-get install g++) or set CXX to its path, or use compile='off'",
                f"inductor needs a C++ compiler ({tried}) there; this machine has none",
            )
        elif simulated:
            notes.append(
                f"not checked on the simulated machine: inductor needs a C++ compiler ({tried}) "
                f"there; this machine has {support.cxx}"
            )
        else:
            codegen = f"C++ compiled by {support.cxx} (torch._inductor.config.cpp.cxx)"
    elif device_type in ("cuda", "xpu"):
        here = "installed" if support.triton else "not installed"
        if not support.triton or simulated:
            missing(
                "inductor on a GPU writes Triton kernels and Triton is not installed "
                "(torch.utils._triton.has_triton() is False); pip install triton, or use "
                "compile='off'",
                f"inductor needs Triton for GPU kernels there (here it is {here})",
            )
    mode = requested
    what, fallback = _mode_reason(mode, device_type, support)
    options = tuple(sorted(support.options(mode).items()))
    sets = ", ".join(f"{k}={v}" for k, v in options) or "no options beyond inductor's defaults"
    reason = (
        f"torch.compile(mode={mode!r}) with inductor on {where}, generating {codegen}; "
        f"{what}; mode {mode!r} sets {sets} (torch._inductor.list_mode_options(), "
        f"torch {support.torch_version}); compile time is reported apart from step times"
    )
    if notes:
        reason += "; " + "; ".join(notes)
    outcome = f"{mode} (inductor{', CUDA graphs skipped' if fallback else ''})"
    return CompilePlan(
        requested=requested,
        mode=mode,
        device_type=device_type,
        backend="inductor",
        codegen=codegen,
        outcome=outcome,
        reason=reason,
        fallback=fallback,
        options=options,
        simulated=simulated,
        torch_version=support.torch_version,
    )
