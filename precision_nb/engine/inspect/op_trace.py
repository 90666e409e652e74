"""An op-by-op dtype trace of one forward + backward: every ATen op, its input and output dtypes.

:class:`OpTracer` is a context manager that enters two of torch's own mechanisms:

- a ``TorchFunctionMode`` that notes the torch-level call an op came from (``linear``,
  ``layer_norm``, ``cross_entropy``): autocast's kernel for a call is looked up by that name first
  (:mod:`.policy`, read from the running torch);
- a ``TorchDispatchMode`` (``torch.utils._python_dispatch``) that sees every ATen op *after*
  autocast has cast its inputs, so the dtypes it records are the ones that really ran. FLOPs per
  op come from the formulas a run counts its FLOPs with (:func:`~precision_nb.engine.metrics.
  flop_formulas`: ``torch.utils.flop_counter``'s, attention on every device included).

Casts of a parameter's storage (``_to_copy`` of a weight) are kept by a weak reference to their
output storage so the memory breakdown can count autocast's weight copies: each distinct storage
once. The key is the storage itself (a ``StorageWeakRef``), never its data address: a copy freed
before the next cast (autocast without its weight cache frees each copy after its op) leaves its
address to the allocator, which may hand it to the next copy, and the two are still two copies;
the weak reference pins the freed storage's record, not its memory, so no later storage gets its
identity. Nothing here changes what an op computes; an op the tracer cannot describe is recorded
in :attr:`OpTracer.unattributed` with the reason, never raised.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from precision_nb.engine.inspect.policy import (
    FP32,
    LOW,
    PROMOTE,
    cross_device_difference,
    policy_of,
)
from precision_nb.engine.metrics import flop_formulas

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
    """mm addmm bmm baddbmm addbmm matmul linear convolution _convolution convolution_backward
    mkldnn_convolution cudnn_convolution _scaled_dot_product_flash_attention
    _scaled_dot_product_efficient_attention _scaled_dot_product_flash_attention_for_cpu
    _scaled_dot_product_cudnn_attention _scaled_dot_product_flash_attention_for_cpu_backward
    _scaled_dot_product_flash_attention_backward _scaled_dot_product_efficient_attention_backward
    """.split()
)
_NO_API = ("__get__", "__set__", "__delete__")
#: ATen ops that alias their input without being marked as views in their schema.
ALIAS_OPS = frozenset({"_unsafe_view", "_reshape_alias", "alias", "detach", "lift_fresh"})
#: ATen ops that copy or fill memory without arithmetic (a same-dtype ``_to_copy`` too; ops with
#: no tensor input, such as ``ones`` or ``arange``, count as such as well).
COPY_OPS = frozenset(
    """clone contiguous copy copy_ lift_fresh_copy _to_copy empty_like zeros_like ones_like
    full_like new_empty new_zeros new_ones new_full fill fill_ zero_""".split()
)

# verdicts, one per trace row
RAN_LOW = "ran in {dtype}"
KEPT_FP32 = "kept in fp32 by autocast"
PROMOTED_FP32 = "fp32: autocast promotes it to its widest input"
NOT_LISTED = "fp32: autocast leaves the op alone (no autocast kernel)"
FP32_LISTED_LOW = "fp32 although autocast casts it to low precision"
NO_AUTOCAST = "fp32: no autocast in this plan"
CAST = "cast inserted"
VIEW = "view or copy / no arithmetic"
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


class _TracerMode:
    """A torch mode that reports to its :class:`OpTracer`."""

    def __init__(self, tracer: OpTracer) -> None:
        super().__init__()
        self.tracer = tracer


class _ApiMode(_TracerMode, TorchFunctionMode):
    """Remembers the outermost torch-level call (nested calls are not seen: the mode is off)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", None)
        outer = self.tracer.api
        if outer is None and name not in _NO_API:
            self.tracer.api = name
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.tracer.api = outer


class _DispatchRecorder(_TracerMode, TorchDispatchMode):
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
        #: each distinct output storage of a parameter cast (a weak reference, so a freed copy
        #: stays distinct from a later one at the same address) -> (dtype, bytes)
        self.weight_copies: dict[StorageWeakRef, tuple[torch.dtype, int]] = {}
        #: (parameter storage, offset, shape, stride, cast dtype) -> bytes of one cast of it
        self.cast_params: dict[tuple[Any, ...], int] = {}
        #: the output storages of casts of the batch's tensors (weak references)
        self.input_copies: set[StorageWeakRef] = set()
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

    def copy_of(self, storage: torch.UntypedStorage) -> str | None:
        """``"parameter"`` or ``"input"`` when ``storage`` is the output of a cast of one."""
        key = StorageWeakRef(storage)
        if key in self.weight_copies:
            return "parameter"
        return "input" if key in self.input_copies else None

    def weight_copy_sizes(self) -> list[tuple[torch.dtype, int]]:
        """(dtype, bytes) of each distinct output storage of a parameter cast in the trace."""
        return list(self.weight_copies.values())

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
        elif func.is_view or op in ALIAS_OPS:
            kind = "view"
        elif op in COPY_OPS or not ins:
            kind = "copy"
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
            key = StorageWeakRef(outs[0].untyped_storage())
            if src in self.param_storages:
                self.weight_copies[key] = (outs[0].dtype, nbytes)
                source = ins[0]
                identity = (src, source.storage_offset(), tuple(source.shape), source.stride())
                self.cast_params[(*identity, outs[0].dtype)] = nbytes
            elif src in self.input_storages:
                self.input_copies.add(key)
        formula = flop_formulas().get(func.overloadpacket)
        if formula is not None:
            try:
                self.flops[key] += int(formula(*args, **kwargs, out_val=out))
            except (RuntimeError, TypeError, ValueError, IndexError) as exc:
                self.unattributed[(op, f"FLOP formula failed: {type(exc).__name__}")] += 1

    # ------------------------------------------------------------------------- results

    def parameter_casts(self) -> list[tuple[torch.dtype, int]]:
        """(dtype, bytes) of each distinct parameter cast in the trace (each parameter view and
        target dtype once, however often it was cast): what autocast's weight copies should hold.
        """
        return [(key[-1], nbytes) for key, nbytes in self.cast_params.items()]

    def rows(self, plan: Any) -> list[dict[str, Any]]:
        """One row per (phase, torch call, op, input dtypes, output dtype, kind), with a verdict."""
        total = sum(self.flops.values())
        autocast = bool(getattr(plan, "autocast_enabled", False))
        device_type = getattr(plan, "device_type", "cpu")
        dtype = getattr(plan, "dtype", None)
        rows = []
        for key, count in self.calls.items():
            phase, api, op, in_dtypes, out_dtype, kind = key
            flops = self.flops.get(key, 0)
            looked_up = autocast and phase != "backward" and kind in ("compute", "in-place")
            listed = policy_of(device_type, api, op, dtype) if looked_up else None
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
    if kind in ("view", "copy"):
        return VIEW
    if out in ("bf16", "fp16"):
        return RAN_LOW.format(dtype=out)
    if out != "fp32":
        return OTHER
    if phase == "backward":
        return BACKWARD_FP32
    if not autocast:
        return NO_AUTOCAST
    return {FP32: KEPT_FP32, PROMOTE: PROMOTED_FP32, LOW: FP32_LISTED_LOW}.get(listed, NOT_LISTED)


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
    torch call that autocast keeps in fp32 on CPU but not on CUDA, or the other way round.
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
        if (
            not name
            or name in seen
            or not r["phase"].startswith("forward")
            or r["kind"] not in ("compute", "in-place")
            or r["output"] not in ("fp32", "bf16", "fp16")  # autocast casts floats only
        ):
            continue
        seen.add(name)
        other = cross_device_difference(name, plan.device_type, r["op"])
        if other is not None:
            here = policy_of(plan.device_type, name, r["op"]) or "no autocast kernel"
            out.append(
                Flag(
                    "cross_device_policy",
                    f"{name}: autocast's policy in this torch differs by device "
                    f"({plan.device_type}: {here}; {other}); here it produced {r['output']}",
                    {"call": name, "device_type": plan.device_type, "here": here, "other": other},
                )
            )
    return out
