"""AdamW building with an honest fused decision.

A probe alone is not enough: a probe on a CUDA parameter could succeed while construction with the
CPU-built model's parameters failed and fell back to plain AdamW silently. So
:func:`build_optimizer` moves the model to the training device *first* and builds from those real
parameters. ``fused=None`` follows the resolution rules (probe; fused only when the CUDA probe
passes), so on CPU it gives plain AdamW even though torch also ships a CPU fused AdamW;
``fused=True`` attempts fused on any device, CPU included, and reports what happened.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from precision_nb.core import validate
from precision_nb.core.device import resolve_device

if TYPE_CHECKING:
    from precision_nb.core.capabilities import Capabilities

logger = logging.getLogger(__name__)

#: Errors a fused AdamW construction raises when fused is not possible (the spec's list).
FUSED_ERRORS = (TypeError, RuntimeError, ValueError)

_FUSED_ALLOWED = "null/None (probe), true (attempt), false (disable)"


def plain_adamw_kind(device_type: str) -> str:
    """The implementation torch's AdamW picks with ``foreach`` and ``fused`` left at None on
    ``device_type``: "foreach" where torch has foreach kernels for the device (its own list,
    ``torch.utils._foreach_utils``), else "for-loop"; "unknown" where this torch has no list."""
    try:
        from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices
    except ImportError:
        return "unknown"
    return "foreach" if device_type in _get_foreach_kernels_supported_devices() else "for-loop"


#: What plain AdamW does on a CPU against fused, what is known, and where it is measured
#: (``precision_nb.time_adamw``): the implementation is read from torch, no timing is claimed.
PLAIN_ADAMW_COST = (
    f"plain AdamW on a CPU is torch's {plain_adamw_kind('cpu')} implementation: several ATen ops "
    "per parameter tensor, each dispatched on its own and each a pass over the tensor's memory, "
    "where fused AdamW is one op that updates each tensor in one pass; what that saves depends on "
    "the number and sizes of the tensors and the threads, so precision_nb.time_adamw(model) "
    "measures it on this machine"
)


def _number(name: str, value: Any, minimum: float, strict: bool) -> float:
    # YAML reads "1e-3" (no dot) as a string, so numeric strings are accepted.
    return validate.number(
        f"optimizer.{name}", value, minimum=minimum, strict=strict, accept_str=True
    )


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW settings. ``fused``: None probes, True attempts, False disables."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    fused: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _number("lr", self.lr, 0.0, strict=True))
        object.__setattr__(self, "eps", _number("eps", self.eps, 0.0, strict=True))
        wd = _number("weight_decay", self.weight_decay, 0.0, strict=False)
        object.__setattr__(self, "weight_decay", wd)
        betas, pair = self.betas, ()
        if isinstance(betas, (tuple, list)) and len(betas) == 2:
            pair = tuple(_number("betas", b, 0.0, strict=False) for b in betas)
        if len(pair) != 2 or any(b >= 1.0 for b in pair):
            raise ValueError(
                f"optimizer.betas: invalid value {validate.short_repr(betas)}; "
                "allowed: two numbers in [0, 1)"
            )
        object.__setattr__(self, "betas", pair)
        if self.fused is not None and not isinstance(self.fused, bool):
            raise ValueError(
                f"optimizer.fused: invalid value {validate.short_repr(self.fused)} "
                f"({type(self.fused).__name__}); "
                f"allowed: {_FUSED_ALLOWED}"
            )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["betas"] = list(self.betas)
        return data


@dataclass(frozen=True)
class FusedOutcome:
    """What happened to the fused AdamW request.

    ``requested``: the config's ``fused`` (None/True/False). ``probed``: the fused AdamW probe
    (one element) on the training device (None when no probe ran). ``used``: whether the
    optimizer is fused. ``reason``: why, in words.
    """

    requested: bool | None
    probed: bool | None
    used: bool
    reason: str
    device: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _one_element_parameter(device: torch.device) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.zeros(1, device=device))


def probe_fused_adamw(device: Any) -> tuple[bool, str]:
    """Build a zero-step fused AdamW on a one-element parameter on ``device`` (any type).

    Returns (ok, detail). Unlike :func:`supports_fused_adamw` this also probes CPU and MPS.
    """
    dev = torch.device(device)
    try:
        param = _one_element_parameter(dev)
    except (RuntimeError, AssertionError) as exc:
        return False, f"cannot place a parameter on {dev}: {type(exc).__name__}: {exc}"
    try:
        torch.optim.AdamW([param], fused=True)
    except FUSED_ERRORS as exc:
        return False, f"fused AdamW on {dev} failed: {type(exc).__name__}: {exc}"
    return True, f"fused AdamW on a one-element {dev} parameter built"


def supports_fused_adamw(device: Any) -> bool:
    """The fused AdamW probe: False off CUDA; on CUDA a zero-step fused AdamW on one element."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return False
    ok, detail = probe_fused_adamw(dev)
    logger.debug("supports_fused_adamw(%s): %s", dev, detail)
    return ok


def _has_fused_kernel(device_type: str) -> bool | None:
    """Whether torch registers a fused AdamW kernel for a device type (None: cannot tell).

    A dispatcher lookup: it costs microseconds, unlike building an optimizer.
    """
    key = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}.get(device_type)
    lookup = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    if key is None or lookup is None:
        return None
    try:
        return bool(lookup("aten::_fused_adamw_", key))
    except RuntimeError:
        return None


def _cpu_kernel_note() -> str:
    has = _has_fused_kernel("cpu")
    if has is None:
        return "torch's CPU fused AdamW exists in torch >= 2.4 (this torch could not be asked)"
    if has:
        return "torch's CPU fused AdamW exists (this torch has the kernel)"
    return "torch's CPU fused AdamW exists in torch >= 2.4, but this torch lacks the kernel"


def describe_fused(
    config: OptimizerConfig, device: torch.device, caps: Capabilities
) -> tuple[str, str, bool]:
    """The fused-AdamW decision for an explanation: (outcome, reason, fallback).

    CUDA is probed only when it is really present; the CPU kernel is looked up in torch's
    dispatcher (cheap); simulated hardware is described, not probed.
    """
    fused = config.fused
    kind = device.type
    if fused is False:
        return "plain AdamW", "optimizer.fused=false disables fused AdamW", False
    real_cuda = kind == "cuda" and not caps.simulated and caps.cuda_available
    if fused is None:
        if kind == "cuda":
            if real_cuda:
                if supports_fused_adamw(device):
                    return (
                        "fused AdamW",
                        f"optimizer.fused=null probes: fused AdamW built on {device}; "
                        "build_optimizer builds it again from the model's real parameters on "
                        f"{device} and records the outcome",
                        False,
                    )
                return (
                    "plain AdamW",
                    f"optimizer.fused=null probes: the fused AdamW probe on {device} failed, so "
                    "plain AdamW is used",
                    True,
                )
            return (
                "fused AdamW (expected)",
                "optimizer.fused=null probes on CUDA; simulated hardware is not probed - on a "
                "real CUDA device build_optimizer probes and builds with the model's parameters",
                False,
            )
        cpu_note = ""
        if kind == "cpu":
            cpu_note = (
                f" {_cpu_kernel_note()}; set optimizer.fused=true to use it. What plain AdamW "
                f"costs: {PLAIN_ADAMW_COST}."
            )
        return (
            "plain AdamW",
            "optimizer.fused=null probes, and the fused AdamW probe (supports_fused_adamw) is "
            f"false off CUDA, so {kind} gets plain AdamW.{cpu_note}",
            False,
        )
    # fused is True: attempted at build time on the model's real parameters
    if kind == "cpu":
        if _has_fused_kernel("cpu") is False:
            return (
                "plain AdamW",
                "optimizer.fused=true, but this torch has no CPU fused AdamW kernel; "
                "build_optimizer would fall back to plain AdamW and log a warning",
                True,
            )
        return (
            "fused AdamW",
            f"optimizer.fused=true attempts torch's CPU fused AdamW: {_cpu_kernel_note()}; "
            "build_optimizer builds it from the model's real parameters and records the outcome",
            False,
        )
    if real_cuda:
        ok, detail = probe_fused_adamw(device)
        if ok:
            return (
                "fused AdamW",
                f"optimizer.fused=true attempts fused AdamW on {device}: {detail}; "
                "build_optimizer builds it from the model's real parameters",
                False,
            )
        return (
            "plain AdamW",
            f"optimizer.fused=true attempted fused AdamW on {device} but {detail}; "
            "build_optimizer would fall back to plain AdamW and log a warning",
            True,
        )
    return (
        "fused AdamW (attempt)",
        f"optimizer.fused=true attempts fused AdamW on {device} at build time; not probed here "
        f"({'simulated hardware' if caps.simulated else 'device not probed'}); the outcome is "
        "recorded on the optimizer",
        False,
    )


def as_optimizer_config(config: Any) -> OptimizerConfig:
    """``config`` if it is an :class:`OptimizerConfig`, the defaults for None; else ValueError."""
    if config is None:
        return OptimizerConfig()
    if isinstance(config, OptimizerConfig):
        return config
    raise ValueError(
        f"optimizer: invalid value {validate.short_repr(config)} ({type(config).__name__}); "
        "expected an OptimizerConfig or None"
    )


def build_optimizer(model: torch.nn.Module, config: Any, device: Any) -> torch.optim.Optimizer:
    """Move ``model`` to ``device`` (in place) and build AdamW on its real parameters.

    The fused decision is made with those parameters on that device, so probe and construction
    cannot disagree unnoticed. The outcome is attached as ``optimizer.precision_nb_fused``
    (:class:`FusedOutcome`); a requested (``fused=True``) fused build that fails is logged as a
    warning and falls back to plain AdamW.
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"model: invalid value of type {type(model).__name__}; expected a torch.nn.Module"
        )
    cfg = as_optimizer_config(config)
    dev = resolve_device(device)  # RuntimeError for absent CUDA/MPS, ValueError for bad input
    try:
        model.to(dev)
    except AssertionError as exc:  # a torch build without this backend asserts
        raise RuntimeError(f"device: cannot move the model to {dev}: {exc}") from exc
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model: has no trainable parameters (requires_grad=True) to optimize")
    kwargs = {"lr": cfg.lr, "betas": cfg.betas, "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    optimizer: torch.optim.Optimizer | None = None
    if cfg.fused is False:
        outcome = FusedOutcome(False, None, False, "optimizer.fused=false: plain AdamW", str(dev))
    elif cfg.fused is None and not supports_fused_adamw(dev):
        if dev.type == "cuda":
            reason = f"fused=None: the fused AdamW probe on {dev} failed; plain AdamW"
        elif dev.type == "cpu":
            reason = (
                f"fused=None: the fused AdamW probe is false off CUDA, so {dev.type} gets "
                "plain AdamW (torch's CPU fused AdamW exists; fused=True attempts it): "
                + PLAIN_ADAMW_COST
            )
        else:
            reason = f"fused=None: the fused AdamW probe is false off CUDA; plain AdamW on {dev}"
        outcome = FusedOutcome(None, False, False, reason, str(dev))
        logger.info("build_optimizer: %s", reason)
    else:  # fused: asked for (True), or the CUDA probe passed (None); plain AdamW if it fails
        if cfg.fused:
            built = f"fused=True: fused AdamW built on {dev} from the model's real parameters"
            failed = f"fused=True: building fused AdamW on {dev} from the model's parameters failed"
            after = "plain AdamW is used instead"
        else:
            built = f"fused=None: probe passed on {dev}; fused AdamW built on the real params"
            failed = (
                f"fused=None: the probe on {dev} passed but building fused AdamW from the "
                f"model's {len(params)} parameter tensors failed"
            )
            after = "plain AdamW"
        try:
            optimizer = torch.optim.AdamW(params, fused=True, **kwargs)
            outcome = FusedOutcome(cfg.fused, True, True, built, str(dev))
        except FUSED_ERRORS as exc:
            reason = f"{failed} ({type(exc).__name__}: {exc}); {after}"
            logger.warning("build_optimizer: %s", reason)
            # probed: the CUDA probe passed when fused was left to it; an attempt probes nothing
            outcome = FusedOutcome(cfg.fused, cfg.fused is None, False, reason, str(dev))
    if optimizer is None:
        optimizer = torch.optim.AdamW(params, **kwargs)
    optimizer.precision_nb_fused = outcome  # type: ignore[attr-defined]
    return optimizer
