"""An op-by-op dtype trace of one forward + backward: every ATen op, its input and output dtypes.

:class:`OpTracer` is a context manager that enters two of torch's own mechanisms:

- a ``TorchFunctionMode`` that notes the torch-level call an op came from (``linear``,
  ``layer_norm``, ``cross_entropy``): autocast's documented lists are written in those names;
- a ``TorchDispatchMode`` (``torch.utils._python_dispatch``) that sees every ATen op *after*
  autocast has cast its inputs, so the dtypes it records are the ones that really ran. FLOPs per
  op come from ``torch.utils.flop_counter``'s formula registry (the one ``FlopCounterMode`` uses).

Casts of a parameter's storage (``_to_copy`` of a weight) are kept as weakrefs so the memory
breakdown can count autocast's weight copies. Nothing here changes what an op computes; an op the
tracer cannot describe is recorded in :attr:`OpTracer.unattributed` with the reason, never raised.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from precision_nb.engine.inspect.policy import FP32, LOW, cross_device_difference, policy_of

log = logging.getLogger(__name__)

SHORT = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.bool: "bool",
}
CAST_OPS = frozenset({"_to_copy", "to", "_copy_from", "copy_", "convert_element_type"})
#: ATen ops that do the heavy arithmetic of a training step (matmuls, convolutions, attention).
MATMUL_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "matmul",
        "linear",
        "convolution",
        "_convolution",
        "convolution_backward",
        "mkldnn_convolution",
        "cudnn_convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention_backward",
    }
)
_NO_API = ("__get__", "__set__", "__delete__")

# verdicts, one per trace row
RAN_LOW = "ran in {dtype}"
KEPT_FP32 = "kept in fp32 by autocast"
NOT_LISTED = "fp32: the op is not on autocast's lists"
FP32_LISTED_LOW = "fp32 although autocast lists it for low precision"
NO_AUTOCAST = "fp32: no autocast in this plan"
CAST = "cast inserted"
VIEW = "view / no arithmetic"
OTHER = "integer / bool / other dtype"
BACKWARD_FP32 = "fp32 in backward (follows the forward's dtypes)"


def short(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bf16"`` (other dtypes: their name without ``torch.``)."""
    return SHORT.get(dtype, str(dtype).replace("torch.", ""))


@dataclass(frozen=True)
class Flag:
    """Something in a trace a user would want to know: ``kind``, readable ``message``, ``data``."""

    kind: str  # "fp32_matmul" | "many_casts" | "cross_device_policy" | "unattributed" | "simulated"
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "data": dict(self.data)}


class _ApiMode(TorchFunctionMode):
    """Remembers the outermost torch-level call (nested calls are not seen: the mode is off)."""

    def __init__(self, tracer: OpTracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", None)
        outer = self.tracer.api
        if outer is None and name not in _NO_API:
            self.tracer.api = name
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.tracer.api = outer


class _DispatchRecorder(TorchDispatchMode):
    def __init__(self, tracer: OpTracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self.tracer.record(func, args, kwargs, out)
        except (RuntimeError, TypeError, ValueError, AttributeError, NotImplementedError) as exc:
            self.tracer.unattributed[
                (str(func), f"could not be described: {type(exc).__name__}: {exc}")
            ] += 1
        return out


class OpTracer:
    """Records every ATen op inside ``with tracer:``; set :attr:`phase` before ``backward()``.

    ``param_storages``: data pointers of the parameters' storages, so casts of weights are told
    apart from casts of activations.
    """

    def __init__(self, param_storages: set[int], input_storages: set[int] = frozenset()) -> None:
        self.param_storages = param_storages
        self.input_storages = input_storages
        self.phase = "forward"
        self.api: str | None = None
        self.calls: Counter[tuple[Any, ...]] = Counter()
        self.flops: Counter[tuple[Any, ...]] = Counter()
        self.cast_bytes: Counter[tuple[Any, ...]] = Counter()
        self.unattributed: Counter[tuple[str, str]] = Counter()
        #: output storage pointer -> (weakref to the cast output, dtype, bytes)
        self.weight_copies: dict[int, tuple[Any, torch.dtype, int]] = {}
        #: output storage pointer -> weakref, for casts of the batch's tensors
        self.input_copies: dict[int, Any] = {}
        #: parameter storage pointer -> the dtypes its values entered arithmetic in (a cast's
        #: output dtype, else the parameter's own; views are not uses)
        self.param_uses: dict[int, set[str]] = {}
        self._modes: list[Any] = []

    def __enter__(self) -> OpTracer:
        self._modes = [_ApiMode(self), _DispatchRecorder(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._modes = []

    def copy_of(self, ptr: int) -> str | None:
        """``"parameter"`` or ``"input"`` while the storage at ``ptr`` is a live cast of one."""
        entry = self.weight_copies.get(ptr)
        if entry is not None and entry[0]() is not None:
            return "parameter"
        ref = self.input_copies.get(ptr)
        return "input" if ref is not None and ref() is not None else None

    def record(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        op = func.overloadpacket.__name__
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        in_dtypes = "+".join(sorted({short(t.dtype) for t in ins})) or "-"
        out_dtype = short(outs[0].dtype) if outs else "-"
        phase = self.phase
        if phase == "forward" and not torch.is_grad_enabled():
            phase = "forward (no_grad)"
        api = self.api if phase != "backward" else None
        if phase != "backward" and api is None:
            self.unattributed[
                (
                    op,
                    "no torch-level call around it (a C++ extension or torch internal): "
                    "named by its ATen op only",
                )
            ] += 1
        if op in CAST_OPS and ins and outs and ins[0].dtype != outs[0].dtype:
            from_param = ins[0].untyped_storage().data_ptr() in self.param_storages
            kind = "weight cast" if from_param else "cast"
        elif func.is_view:
            kind = "view"
        elif func._schema.is_mutable:
            kind = "in-place"
        else:
            kind = "compute"
        key = (phase, api or "", op, in_dtypes, out_dtype, kind)
        self.calls[key] += 1
        if kind != "view" and outs:
            for t in ins:
                ptr = t.untyped_storage().data_ptr()
                if ptr in self.param_storages:
                    used = out_dtype if kind == "weight cast" else short(t.dtype)
                    self.param_uses.setdefault(ptr, set()).add(used)
        if kind in ("cast", "weight cast"):
            nbytes = outs[0].numel() * outs[0].element_size()
            self.cast_bytes[key] += nbytes
            src = ins[0].untyped_storage().data_ptr()
            ptr = outs[0].untyped_storage().data_ptr()
            if src in self.param_storages:
                self.weight_copies[ptr] = (weakref.ref(outs[0]), outs[0].dtype, nbytes)
            elif src in self.input_storages:
                self.input_copies[ptr] = weakref.ref(outs[0])
        formula = flop_registry.get(func.overloadpacket)
        if formula is not None:
            try:
                self.flops[key] += int(formula(*args, **kwargs, out_val=out))
            except (RuntimeError, TypeError, ValueError, IndexError) as exc:
                self.unattributed[(op, f"FLOP formula failed: {type(exc).__name__}")] += 1

    # ------------------------------------------------------------------------- results

    def rows(self, plan: Any) -> list[dict[str, Any]]:
        """One row per (phase, torch call, op, input dtypes, output dtype, kind), with a verdict."""
        total = sum(self.flops.values())
        autocast = bool(getattr(plan, "autocast_enabled", False))
        device_type = getattr(plan, "device_type", "cpu")
        rows = []
        for key, count in self.calls.items():
            phase, api, op, in_dtypes, out_dtype, kind = key
            flops = self.flops.get(key, 0)
            listed = policy_of(device_type, api or op) if autocast else None
            rows.append(
                {
                    "phase": phase,
                    "call": api,
                    "op": op,
                    "inputs": in_dtypes,
                    "output": out_dtype,
                    "kind": kind,
                    "count": count,
                    "flops": flops,
                    "flops_share": flops / total if total else 0.0,
                    "cast_bytes": self.cast_bytes.get(key, 0),
                    "autocast_list": listed,
                    "verdict": verdict(phase, kind, out_dtype, listed, autocast),
                }
            )
        order = {"forward": 0, "forward (no_grad)": 1, "backward": 2}
        rows.sort(key=lambda r: (order.get(r["phase"], 3), -r["flops"], -r["count"], r["op"]))
        return rows

    def unattributed_rows(self) -> list[dict[str, Any]]:
        return [
            {"what": what, "reason": reason, "count": n}
            for (what, reason), n in sorted(self.unattributed.items())
        ]


def verdict(phase: str, kind: str, out: str, listed: str | None, autocast: bool) -> str:
    """The one-line verdict of a trace row (see the module's constants)."""
    if kind in ("cast", "weight cast"):
        return CAST
    if kind == "view":
        return VIEW
    if out in ("bf16", "fp16"):
        return RAN_LOW.format(dtype=out)
    if out != "fp32":
        return OTHER
    if phase == "backward":
        return BACKWARD_FP32
    if not autocast:
        return NO_AUTOCAST
    if listed == FP32:
        return KEPT_FP32
    if listed == LOW:
        return FP32_LISTED_LOW
    return NOT_LISTED


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows grouped by verdict: calls, FLOPs share, bytes (casts) and the ops in each group."""
    groups: dict[str, dict[str, Any]] = {}
    for r in rows:
        g = groups.setdefault(
            r["verdict"],
            {"verdict": r["verdict"], "calls": 0, "flops_share": 0.0, "bytes": 0, "ops": Counter()},
        )
        g["calls"] += r["count"]
        g["flops_share"] += r["flops_share"]
        g["bytes"] += r["cast_bytes"]
        g["ops"][r["call"] or r["op"]] += r["count"]
    out = []
    for g in groups.values():
        ops = ", ".join(name for name, _ in g["ops"].most_common(6))
        out.append({**g, "ops": ops})
    return sorted(out, key=lambda g: (-g["flops_share"], -g["calls"]))


def flags(
    rows: list[dict[str, Any]], plan: Any, *, large_share: float = 0.05, many_casts: int = 10
) -> list[Flag]:
    """What a user would want to know about a trace (see :class:`Flag` kinds).

    A matmul-class op that ran in fp32 under a mixed plan with at least ``large_share`` of the
    step's FLOPs; forward casts of activations or inputs (weight casts are autocast's normal
    cache) at least ``many_casts`` in number and a quarter of the forward's compute calls; a
    torch call that autocast keeps in fp32 on one documented device but not on the other.
    """
    out: list[Flag] = []
    if not getattr(plan, "is_mixed_precision", False):
        return out
    for r in rows:
        if r["op"] in MATMUL_OPS and r["output"] == "fp32" and r["flops_share"] >= large_share:
            out.append(
                Flag(
                    "fp32_matmul",
                    f"{r['op']} ({r['phase']}, from {r['call'] or 'autograd'}) ran in fp32 under "
                    f"the {plan.mode} plan: {r['flops_share']:.0%} of the step's counted FLOPs",
                    {"op": r["op"], "phase": r["phase"], "flops_share": r["flops_share"]},
                )
            )
    forward = [r for r in rows if r["phase"].startswith("forward")]
    casts = [r for r in forward if r["kind"] == "cast"]
    n_casts = sum(r["count"] for r in casts)
    n_compute = sum(r["count"] for r in forward if r["kind"] in ("compute", "in-place"))
    if n_casts >= many_casts and n_casts * 4 >= n_compute:
        nbytes = sum(r["cast_bytes"] for r in casts)
        out.append(
            Flag(
                "many_casts",
                f"{n_casts} casts of activations or inputs (not weights) for {n_compute} compute "
                f"ops in the forward ({nbytes / 2**20:.2f} MiB written by them): tensors move "
                "between dtypes, e.g. an fp32 residual stream feeding low-precision matmuls",
                {"casts": n_casts, "compute_ops": n_compute, "bytes": nbytes},
            )
        )
    seen: set[str] = set()
    for r in rows:
        name = r["call"]
        if not name or name in seen or not r["phase"].startswith("forward"):
            continue
        seen.add(name)
        other = cross_device_difference(name, plan.device_type)
        if other is not None:
            here = policy_of(plan.device_type, name) or "on no list"
            out.append(
                Flag(
                    "cross_device_policy",
                    f"{name}: autocast's documented policy differs by device ({plan.device_type}: "
                    f"{here}; {other}); here it produced {r['output']}",
                    {"call": name, "device_type": plan.device_type, "here": here, "other": other},
                )
            )
    return out
