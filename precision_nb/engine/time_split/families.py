"""The op families of a training step, and one profiled step's time grouped into them.

A profiled step is the events the profiler recorded inside one step mark (and, on other
threads, inside its time range). Each event's self time goes to one family, decided top-down:

- the optimizer's own range (``Optimizer.step#...``, ``Optimizer.zero_grad#...``) and the grad
  scaler's ops (``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``) are
  the **optimizer** step, everything inside them included;
- collectives (``c10d::``, ``nccl``, ``gloo``, ``record_param_comms``) are **communication**;
- a cast is a cast op of the op trace (:data:`~precision_nb.engine.inspect.op_trace.CAST_OPS`)
  whose floating dtype changes, by the same rule the op trace uses; it is **autocast's** when
  another op issued it (``aten::linear`` casting its weight, ``cross_entropy`` casting to fp32)
  or when it is the backward of such a cast, else the model's own; everything inside it
  (allocation, the copy) is the cast's;
- matmul-class ops (the op trace's :data:`~precision_nb.engine.inspect.op_trace.MATMUL_OPS`,
  convolutions, attention) are **matmul**, views and copies inside them included;
- views, copies, allocation and transfers are **data movement**;
- every other ATen op is **normalisation / softmax / elementwise**;
- a compiled graph's own time (``Torch-Compiled Region``, ``CompiledFunction``: the fused kernels
  it runs without naming them to the profiler) is **compiled, not attributed**;
- what remains is **outside ops**: the step's time in no op (Python, the autograd engine's
  bookkeeping, dispatch, kernel launches, waiting), and on CUDA the GPU's idle time.

On CPU the time is the host's self time of each op; on CUDA it is the kernels' time on the device
(each kernel goes to the family of the op that launched it, or by its own name where that op is a
compiled graph), and outside ops is the step's wall time no kernel covered. Nothing here starts a
profiler: :mod:`precision_nb.engine.time_split.profiling` does.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from precision_nb.engine.inspect.op_trace import ALIAS_OPS, CAST_OPS, COPY_OPS, MATMUL_OPS

#: The families, in the order every table shows them: key -> title.
FAMILIES: dict[str, str] = {
    "matmul": "matmul / convolution",
    "casts": "casts (autocast's and the model's)",
    "elementwise": "normalisation / softmax / elementwise",
    "optimizer": "optimizer step",
    "data": "data movement",
    "communication": "communication",
    "compiled": "compiled kernels, not attributed",
    "other": "outside ops (Python, dispatch, launch, idle)",
}
#: The name of the record_function range around each profiled step.
STEP_MARK = "precision_nb::step"

_OPTIMIZER_RANGE = ("Optimizer.step#", "Optimizer.zero_grad#")
_SCALER_OPS = frozenset({"_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_"})
_COMM = re.compile(r"^(c10d::|nccl|gloo|record_param_comms|ncclDevKernel|ncclKernel)", re.I)
_COMPILED = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph")
_MATMUL_PREFIXES = (
    "conv1d", "conv2d", "conv3d", "conv_transpose", "conv_tbc", "_convolution", "cudnn_conv",
    "mkldnn_conv", "miopen_conv", "slow_conv", "thnn_conv", "_nnpack", "mkldnn_linear",
    "_scaled_dot_product", "scaled_dot_product",
)  # fmt: skip
_MATMUL_EXTRA = frozenset({"_addmm_activation", "einsum", "_mkl_linear", "tensordot", "dot"})
_DATA_OPS = frozenset(
    {"view", "reshape", "t", "transpose", "permute", "expand", "expand_as", "as_strided",
     "slice", "select", "unsqueeze", "squeeze", "narrow", "split", "split_with_sizes", "chunk",
     "unbind", "flatten", "unflatten", "view_as", "empty", "empty_strided", "resize_", "set_",
     "item", "_local_scalar_dense", "cat", "stack", "resolve_conj", "resolve_neg", "numpy_T",
     "embedding", "index_select", "pin_memory", "_pin_memory", "record_stream"}
)  # fmt: skip
#: Kernel names (CUDA) that are matmuls whichever op launched them.
_MATMUL_KERNEL = re.compile(r"gemm|cutlass|cublas|_mm_|triton_tem_|conv|xmma|wgmma", re.I)
#: Bytes per element of the dtype names the profiler records.
_ITEMSIZE = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2}
#: (M, K, N) operand positions of the matmul ops whose shapes are read: op -> (a, b).
_GEMM_ARGS = {"mm": (0, 1), "addmm": (1, 2), "_addmm_activation": (1, 2), "bmm": (0, 1),
              "baddbmm": (1, 2), "addbmm": (1, 2)}  # fmt: skip
#: The ops whose input shapes and dtypes the split reads (ATen names without ``aten::``): copies
#: (:func:`cast_copy`), matmuls and convolutions (:func:`_gemm`); the shapes step records these.
SHAPED_OPS = frozenset({"copy_", "convolution", *_GEMM_ARGS})


def op_name(name: str) -> str:
    """``"aten::addmm"`` -> ``"addmm"``; names outside ATen are returned as they are."""
    return name[6:] if name.startswith("aten::") else name


def _itemsize(dtype: str) -> int:
    """Bytes per element of a floating dtype, 0 for any other."""
    return _ITEMSIZE.get(dtype, 1 if dtype.startswith("c10::Float8") else 0)


def cast_copy(event: Any) -> tuple[str, str, int] | None:
    """(from dtype, to dtype, bytes written) when ``event`` is a ``copy_`` between two floating
    dtypes (the copy inside every cast), else None."""
    if op_name(event.name) != "copy_":
        return None
    dtypes = list(getattr(event, "input_dtypes", None) or [])
    shapes = list(getattr(event, "input_shapes", None) or [])
    if len(dtypes) < 2 or dtypes[0] == dtypes[1] or not all(map(_itemsize, dtypes[:2])):
        return None
    numel = math.prod(shapes[0]) if shapes else 0  # a 0-dim tensor: one element
    return dtypes[1], dtypes[0], numel * _itemsize(dtypes[0])


def _cast_inside(event: Any) -> tuple[str, str, int] | None:
    children = getattr(event, "cpu_children", ()) or ()
    return cast_copy(event) or next(filter(None, map(_cast_inside, children)), None)


def own_family(name: str) -> str | None:
    """The family an event's name decides by itself, or None (a wrapper: outside ops)."""
    if name.startswith(_OPTIMIZER_RANGE):
        return "optimizer"
    if _COMM.match(name):
        return "communication"
    if name.startswith(_COMPILED):
        return "compiled"
    if not name.startswith("aten::"):
        return None
    op = op_name(name)
    if op in _SCALER_OPS:
        return "optimizer"
    if op in MATMUL_OPS or op in _MATMUL_EXTRA or op.startswith(_MATMUL_PREFIXES):
        return "matmul"
    if op in COPY_OPS or op in ALIAS_OPS or op in _DATA_OPS or op in CAST_OPS:
        return "data"
    return "elementwise"


@dataclass(frozen=True)
class Cast:
    """One cast in a profiled step: bytes written, whether autocast issued it (or its backward),
    and its time (seconds, the family's time view)."""

    nbytes: int
    autocast: bool
    seconds: float


@dataclass(frozen=True)
class Matmul:
    """One matmul in a profiled step: op, (M, K, N) (M is None for a convolution: its GEMM rows
    depend on the output size), input dtype and time (seconds)."""

    op: str
    m: int | None
    k: int
    n: int
    dtype: str
    seconds: float


@dataclass
class StepSplit:
    """One profiled step: seconds per family, the step's wall time, its casts and matmuls."""

    wall_s: float
    families: dict[str, float] = field(default_factory=lambda: dict.fromkeys(FAMILIES, 0.0))
    casts: list[Cast] = field(default_factory=list)
    matmuls: list[Matmul] = field(default_factory=list)
    #: Family -> op name -> seconds (what the family's time was spent in).
    ops: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Seconds by which the ops' own times exceed the wall time (threads overlapping), >= 0.
    overlap_s: float = 0.0
    #: Events the profiler recorded in the step (the mark included): what its cost scales with.
    events: int = 0
    #: Family -> events accounted to it (the mark and wrappers to "other").
    family_events: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAMILIES, 0))

    def add(self, family: str, name: str, seconds: float) -> None:
        if seconds <= 0:
            return
        self.families[family] += seconds
        by_op = self.ops.setdefault(family, {})
        by_op[name] = by_op.get(name, 0.0) + seconds


def _gemm(event: Any, op: str, seconds: float) -> Matmul | None:
    shapes = list(getattr(event, "input_shapes", None) or [])
    dtypes = list(getattr(event, "input_dtypes", None) or [])
    if op in _GEMM_ARGS:
        a, b = _GEMM_ARGS[op]
        if len(shapes) <= b or len(shapes[a]) < 2 or len(shapes[b]) < 2:
            return None
        (m, k), n = shapes[a][-2:], shapes[b][-1]
        return Matmul(op, int(m), int(k), int(n), dtypes[a] if len(dtypes) > a else "", seconds)
    if op == "convolution" and len(shapes) > 1 and len(shapes[1]) >= 3:
        weight = shapes[1]
        k = int(math.prod(weight[1:]))
        return Matmul(op, None, k, int(weight[0]), dtypes[1] if len(dtypes) > 1 else "", seconds)
    return None


class _Walk:
    """Assigns the self time of every event under a step to a family (see module docstring)."""

    def __init__(self, split: StepSplit, device: bool, autocast: bool) -> None:
        self.split = split
        self.device = device
        self.autocast = autocast
        #: sequence number -> autocast or not, for forward casts (their backward inherits it)
        self.forward_casts: dict[int, bool] = {}

    def seconds(self, event: Any) -> float:
        if self.device:
            return sum(k.duration for k in getattr(event, "kernels", ()) or ()) / 1e6
        return max(float(event.self_cpu_time_total), 0.0) / 1e6

    def visit(
        self, event: Any, inherited: str | None, parent: Any, backward_of: int | None, gemm: bool
    ) -> None:
        """Account ``event`` and its children; ``inherited``: the family of the op above it
        (None under a wrapper), ``backward_of``: the sequence number of the backward node above
        it, ``gemm``: a matmul whose shapes were read is above it."""
        name = event.name
        family = inherited
        self.split.events += 1
        if inherited not in ("optimizer", "communication", "casts"):
            own = own_family(name)
            cast = _cast_inside(event) if op_name(name) in CAST_OPS else None
            if cast is not None:
                family = "casts"
                self._cast(event, cast, parent, backward_of)
            elif own in ("optimizer", "communication", "compiled", "matmul"):
                family = own
            elif own is not None and inherited in (None, "compiled"):
                family = own
        children = getattr(event, "cpu_children", ()) or ()
        # autocast's kernel casts the inputs, then calls the same op again: read the inner call
        again = any(c.name == name for c in children)
        if family == "matmul" and not gemm and not again:
            found = _gemm(event, op_name(name), _subtree_seconds(event, self.seconds))
            if found is not None:
                self.split.matmuls.append(found)
                gemm = True
        self._account(event, family)
        self.split.family_events[family or "other"] += 1
        node = name.endswith(("Backward0", "Backward1"))
        seq = getattr(event, "sequence_nr", -1)
        for child in children:
            self.visit(child, family, event, seq if node else backward_of, gemm)

    def _account(self, event: Any, family: str | None) -> None:
        if not self.device:
            self.split.add(family or "other", event.name, self.seconds(event))
            return
        for kernel in getattr(event, "kernels", ()) or ():
            fam = family or "other"
            if fam in ("compiled", "other", "elementwise") and _MATMUL_KERNEL.search(kernel.name):
                fam = "matmul"
            self.split.add(fam, kernel.name, kernel.duration / 1e6)

    def _cast(self, event: Any, cast: tuple[str, str, int], parent: Any, backward_of: Any) -> None:
        issuer = getattr(parent, "name", "") if parent is not None else ""
        seq = getattr(event, "sequence_nr", -1)
        if backward_of is not None and backward_of >= 0:
            autocast = self.forward_casts.get(backward_of, False)
        else:  # under a plan with autocast, a cast another op issued is autocast's
            autocast = (
                self.autocast and issuer.startswith("aten::") and op_name(issuer) not in CAST_OPS
            )
            if seq is not None and seq >= 0:
                self.forward_casts[seq] = autocast
        total = _subtree_seconds(event, self.seconds)
        self.split.casts.append(Cast(cast[2], autocast, total))


def _subtree_seconds(event: Any, seconds: Any) -> float:
    return seconds(event) + sum(
        _subtree_seconds(c, seconds) for c in getattr(event, "cpu_children", ()) or ()
    )


def split_step(
    mark: Any, others: Iterable[Any] = (), *, device: bool = False, autocast: bool = True
) -> StepSplit:
    """One step's families from its mark event (``STEP_MARK``) and the root events of other
    threads inside its time range. ``device``: kernels' time on the device (CUDA), else the host's
    self time; ``autocast``: the plan runs under autocast (else no cast is autocast's). Outside
    ops is the wall time the families leave; if they exceed it (ops on several threads at once),
    ``overlap_s`` says by how much and outside ops is 0."""
    wall = float(mark.cpu_time_total) / 1e6
    split = StepSplit(wall)
    walk = _Walk(split, device, autocast)
    for root in (mark, *others):
        walk.visit(root, None, None, None, False)
    if device:  # the mark's host time is no kernel's: outside ops is what kernels leave
        split.families["other"] = 0.0
        split.ops.pop("other", None)
        inside = sum(split.families.values())
        split.add("other", "GPU idle (no kernel running)", max(wall - inside, 0.0))
    total = sum(split.families.values())
    split.overlap_s = max(total - wall, 0.0)
    if split.overlap_s > 0 and split.families["other"] > 0:
        cut = min(split.overlap_s, split.families["other"])
        split.families["other"] -= cut
        split.overlap_s -= cut
    return split


def steps_of(
    events: Sequence[Any], *, device: bool = False, autocast: bool = True, mark: str = STEP_MARK
) -> list[StepSplit]:
    """Every profiled step in ``events`` (a profiler's ``events()``) marked ``mark``, in order
    (``device``, ``autocast``: as :func:`split_step` takes them)."""
    return [
        split_step(step, others, device=device, autocast=autocast)
        for step, *others in step_roots(events, mark)
    ]


def step_roots(events: Sequence[Any], mark: str) -> list[list[Any]]:
    """Per step marked ``mark`` (in time order): its mark event and the root events of other
    threads that start inside its time range (the roots a step's split walks)."""
    roots = [e for e in events if getattr(e, "cpu_parent", None) is None]  # once, not per step
    marks = sorted((e for e in roots if e.name == mark), key=lambda e: e.time_range.start)
    out = []
    for step in marks:
        start, end = step.time_range.start, step.time_range.end
        others = [e for e in roots if e.thread != step.thread and start <= e.time_range.start < end]
        out.append([step, *others])
    return out


def median_families(steps: list[StepSplit]) -> dict[str, float]:
    """Each family's median over the profiled steps: a step the machine interrupted (a time
    slice lost inside one op) moves one step's family, not the median."""
    return {f: statistics.median(s.families[f] for s in steps) for f in FAMILIES}


def top_ops(steps: list[StepSplit]) -> dict[str, tuple[tuple[str, float], ...]]:
    n = len(steps)
    out: dict[str, tuple[tuple[str, float], ...]] = {}
    for fam in FAMILIES:
        acc: dict[str, float] = {}
        for s in steps:
            for name, sec in s.ops.get(fam, {}).items():
                acc[name] = acc.get(name, 0.0) + sec / n
        out[fam] = tuple(sorted(acc.items(), key=lambda kv: -kv[1])[:5])
    return out
