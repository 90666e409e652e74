"""Autocast's op policy read from the running torch: which ATen ops have an autocast kernel on a
device type, and the cast each kernel applies, measured on fake tensors.

- **Which ops**: the dispatcher's registrations for the ``AutocastCPU`` / ``AutocastCUDA`` /
  ``AutocastMPS`` dispatch keys (``torch._C._dispatch_get_registrations_for_dispatch_key``; every
  other op falls through autocast and runs in the dtype it receives).
- **Which cast**: each registered overload is called under autocast on fake tensors of that
  device type (``FakeTensorMode``: no memory, no arithmetic, no GPU needed) while a
  ``TorchDispatchMode`` watches what happens to its arguments before the first op that consumes
  them. fp32 arguments cast to the low dtype mean *lower precision*; low-precision arguments cast to
  fp32 (or ``dtype=float32`` handed to the op) mean *float32*; a low-precision argument cast up
  only beside an fp32 one means *widest input type*. The same call without autocast is the control,
  so casts the op makes by itself are not attributed to autocast.

Measurements are memoised per process (:func:`measure_name`): torch cannot change within a
process, a trace needs a handful of ops (about 5 ms of probing each), and the whole table of a
device type (:func:`device_table`, about 120 overloads) takes a second or two, once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

log = logging.getLogger(__name__)

#: The policies, named as torch's Autocast Op Reference names its lists.
LOW = "lower precision"
FP32 = "float32"
PROMOTE = "widest input type"
REFUSED = "refused under autocast"
DISPATCH_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA", "mps": "AutocastMPS"}
#: The low dtype a device type is probed with when the caller names none (autocast's default
#: on MPS is float16; bfloat16 is valid on CPU and CUDA).
PROBE_DTYPE = {"cpu": torch.bfloat16, "cuda": torch.bfloat16, "mps": torch.float16}
METHOD = (
    "measured: the dispatcher's autocast registrations of this torch, each overload called under "
    "autocast on fake tensors (casts of its arguments against the same call without autocast)"
)


@dataclass(frozen=True)
class Measured:
    """The cast autocast's kernel for one overload applies (``policy`` None: none was seen)."""

    op: str  # "aten::pow.Tensor_Scalar"
    policy: str | None
    evidence: str


class _Stop(Exception):
    """Raised by the recorder at the first op that consumes a probed argument."""


def _check(device_type: str) -> str:
    key = DISPATCH_KEYS.get(device_type)
    if key is None:
        raise ValueError(
            f"device_type: invalid value {device_type!r}; allowed: {', '.join(DISPATCH_KEYS)} "
            "(the device types with an autocast dispatch key)"
        )
    return key


@functools.cache
def registrations(device_type: str) -> tuple[str, ...]:
    """ATen overloads with a kernel for ``device_type``'s autocast dispatch key, sorted."""
    key = _check(device_type)
    names = torch._C._dispatch_get_registrations_for_dispatch_key(key)
    return tuple(sorted(n for n in names if n.startswith("aten::")))


@functools.cache
def overloads_by_name(device_type: str) -> dict[str, tuple[str, ...]]:
    """``{"pow": ("aten::pow.Scalar", ...)}``: registered overloads grouped by op name."""
    out: dict[str, list[str]] = {}
    for qualified in registrations(device_type):
        out.setdefault(qualified.split("::", 1)[1].split(".", 1)[0], []).append(qualified)
    return {name: tuple(ops) for name, ops in out.items()}


def _argument(arg: Any, make: Any) -> tuple[bool, Any]:
    """(pass it?, value) for one schema argument: tensors always, other arguments only when
    required (a plausible value: autocast casts before the op looks at any of them)."""
    kind = str(arg.type)
    if kind in ("Tensor", "Optional[Tensor]"):
        return True, make()
    if kind in ("List[Tensor]", "List[Optional[Tensor]]"):
        return True, [make(), make()]
    if arg.has_default_value():
        return False, None
    if kind.startswith("Optional["):
        return True, None
    simple = {"int": 1, "SymInt": 1, "float": 1.0, "number": 1.0, "bool": False, "str": "fro"}
    if kind in simple:
        return True, simple[kind]
    if kind in ("List[int]", "List[SymInt]"):
        return True, [1] * (getattr(arg, "N", None) or 1)
    if kind == "ScalarType":
        return True, torch.float32
    raise TypeError(f"argument {arg.name} of type {kind} has no probe value")


class _Recorder(TorchDispatchMode):
    """Notes casts of the probed tensors (and views of them) up to the first op using them."""

    def __init__(self, mine: dict[int, int], keep: list[torch.Tensor]) -> None:
        super().__init__()
        self.mine, self.keep = mine, keep
        self.casts: list[tuple[int, torch.dtype, torch.dtype]] = []
        self.dtype_argument: Any = None

    def _adopt(self, out: Any, index: int) -> None:
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.mine[id(t)] = index
                self.keep.append(t)  # alive, so its id is not reused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        touched = [
            self.mine[id(t)]
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and id(t) in self.mine
        ]
        if not touched or func.namespace == "prim":
            return func(*args, **kwargs)
        if func is torch.ops.aten._to_copy.default or func.is_view:
            out = func(*args, **kwargs)
            if func is torch.ops.aten._to_copy.default and out.dtype != args[0].dtype:
                self.casts.append((touched[0], args[0].dtype, out.dtype))
            self._adopt(out, touched[0])
            return out
        for i, a in enumerate(func._schema.arguments):
            if a.name == "dtype":
                positional = not a.kwarg_only and i < len(args)
                self.dtype_argument = args[i] if positional else kwargs.get("dtype")
        raise _Stop


def _observe(
    qualified: str, device_type: str, dtypes: tuple[torch.dtype, ...], enabled: bool, low: Any
) -> tuple[list[tuple[int, torch.dtype, torch.dtype]], Any, str | None]:
    """One probe call of ``qualified``: the casts of its arguments, the ``dtype`` argument the
    op got, and the error it raised (None when it ran)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    base, _, overload = qualified.split("::", 1)[1].partition(".")
    op = getattr(getattr(torch.ops.aten, base), overload or "default")
    mode = FakeTensorMode()
    made: list[torch.Tensor] = []

    def make() -> torch.Tensor:
        dtype = dtypes[min(len(made), len(dtypes) - 1)]
        with mode:
            t = torch.empty(2, 2, device=device_type, dtype=dtype)
        made.append(t)
        return t

    kwargs = {}
    for arg in op._schema.arguments:
        use, value = _argument(arg, make)
        if use:
            kwargs[arg.name] = value
    keep = list(made)
    recorder = _Recorder({id(t): i for i, t in enumerate(made)}, keep)
    was = (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
    # FakeTensorMode logs (ERROR) every meta kernel that rejects its arguments; a probe's
    # arguments are placeholders, so such a rejection is expected and is not the user's error
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    was_disabled = fake_log.disabled
    error = None
    with _disable_current_modes():
        torch.set_autocast_enabled(device_type, enabled)
        torch.set_autocast_dtype(device_type, low)
        fake_log.disabled = True
        try:
            with mode, recorder:
                op(**kwargs)
        except _Stop:
            pass
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as exc:
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            fake_log.disabled = was_disabled
            torch.set_autocast_enabled(device_type, was[0])
            torch.set_autocast_dtype(device_type, was[1])
    return recorder.casts, recorder.dtype_argument, error


def _effect(
    qualified: str, device_type: str, dtypes: tuple[torch.dtype, ...], low: Any
) -> tuple[set[torch.dtype], Any, str | None]:
    """What autocast changed for one set of argument dtypes, against the call without it: the
    dtypes it cast arguments to, the ``dtype`` argument it handed over, and its refusal."""
    casts, dtype_argument, error = _observe(qualified, device_type, dtypes, True, low)
    if not casts and dtype_argument is None and error is None:
        return set(), None, None
    off_casts, off_dtype_argument, off_error = _observe(qualified, device_type, dtypes, False, low)
    extra = Counter(casts) - Counter(off_casts)
    refused = error if error and error != off_error and not casts else None
    handed = dtype_argument if dtype_argument != off_dtype_argument else None
    return {to for _i, _f, to in extra}, handed, refused


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@functools.cache
def measure(device_type: str, qualified: str, low: torch.dtype) -> Measured:
    """The cast autocast applies to ``qualified`` (``"aten::addmm"``) on ``device_type``.

    Deprecated ops (``chain_matmul``, ``qr``, ...) print torch's C++ deprecation warning once per
    process when their body runs; a probe calls ops the user never called, so what torch prints
    meanwhile goes to the DEBUG log instead of the user's stderr.
    """
    _check(device_type)
    fp32 = torch.float32
    try:
        with cpp_output_to_debug_log():
            cast_to, _, refused = _effect(qualified, device_type, (fp32,), low)
            if refused:
                return Measured(qualified, REFUSED, f"raises under autocast: {refused}")
            if low in cast_to:
                return Measured(qualified, LOW, f"float32 arguments cast to {_name(low)}")
            cast_to, handed, _ = _effect(qualified, device_type, (low,), low)
            if fp32 in cast_to:
                return Measured(qualified, FP32, f"{_name(low)} arguments cast to float32")
            if handed == fp32:
                return Measured(qualified, FP32, "dtype=float32 handed to the op")
            if fp32 in _effect(qualified, device_type, (low, fp32), low)[0]:
                text = f"a {_name(low)} argument cast to float32 beside a float32 one"
                return Measured(qualified, PROMOTE, text)
    except (TypeError, AttributeError, RuntimeError) as exc:
        return Measured(qualified, None, f"not measured: {type(exc).__name__}: {exc}")
    return Measured(
        qualified, None, "kernel registered; no cast seen for fp32, low or mixed inputs"
    )


def probe_dtype(device_type: str, dtype: Any = None) -> torch.dtype:
    """``dtype`` when it is a 16-bit float, else the device type's probe default."""
    if dtype in (torch.bfloat16, torch.float16):
        return dtype
    return PROBE_DTYPE[device_type]


@functools.cache
def measure_name(device_type: str, name: str, low: torch.dtype) -> Measured | None:
    """The policy of every registered overload of ``name``; None when none is registered.

    Overloads that disagree (none in torch 2.13) give the most common policy, and the evidence
    names each overload's.
    """
    overloads = overloads_by_name(device_type).get(name)
    if not overloads:
        return None
    found = [measure(device_type, q, low) for q in overloads]
    known = [m for m in found if m.policy is not None] or found
    votes = Counter(m.policy for m in known)
    policy = votes.most_common(1)[0][0]
    if len(votes) == 1:
        evidence = known[0].evidence
    else:
        evidence = "; ".join(f"{m.op}: {m.policy} ({m.evidence})" for m in found)
    return Measured(f"aten::{name}", policy, evidence)


def device_table(device_type: str, dtype: Any = None) -> list[Measured]:
    """Every registered overload of ``device_type`` with its measured policy (one call each)."""
    low = probe_dtype(device_type, dtype)
    return [measure(device_type, q, low) for q in registrations(device_type)]


@contextlib.contextmanager
def cpp_output_to_debug_log(what: str = "probing autocast kernels") -> Iterator[None]:
    """Send what torch's C++ side prints to file descriptor 2 to the DEBUG log meanwhile
    (``what``: what was going on, for the log line)."""
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 in this process: nothing can be printed there
        yield
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace").strip()
            if text:
                log.debug("torch printed while %s: %s", what, text)


# torch-level names that differ from the ATen op autocast's kernel is registered on.
_ALIASES = {
    "cross_entropy": ("cross_entropy_loss",),
    "grid_sample": ("grid_sampler",),
    "softmin": ("softmax",),
    "multi_dot": ("linalg_multi_dot",),
    "GRUCell": ("gru_cell",),
    "LSTMCell": ("lstm_cell",),
    "RNNCell": ("rnn_tanh_cell", "rnn_relu_cell"),
}


def spellings(name: str | None) -> list[str]:
    """The ATen op names a torch-level or ATen ``name`` may reach autocast as, most likely first
    (``"__matmul__"`` -> ``["__matmul__", "matmul"]``, ``"_log_softmax"`` -> ``log_softmax``)."""
    if not name:
        return []
    out = [name, name.strip("_")]
    for suffix in ("_forward", "_backward"):
        if name.endswith(suffix):
            out.append(name[: -len(suffix)].strip("_"))
    if name.startswith("__r") and name.endswith("__"):  # __rpow__ -> pow
        out.append(name[3:-2])
    for spelled in list(out):
        out.extend(_ALIASES.get(spelled, ()))
    return list(dict.fromkeys(out))
