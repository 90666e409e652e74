"""Memory by kind and dtype, read from the tensors themselves, with hand arithmetic beside it.

Rows are plain dicts: ``kind``, ``dtype``, ``bytes`` (measured), ``expected_bytes`` (analytic, or
None where no formula holds), ``counted`` (part of the model-memory sum; allocator and process
figures are shown beside the sum, not in it) and ``method`` (how the number was obtained).

Measured bytes count each storage once (``untyped_storage().nbytes()``), so views and tied
weights are not double counted; expected bytes are ``numel x element size`` from shapes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from precision_nb.engine.inspect.op_trace import short
from precision_nb.engine.memory_probe import host_rss

PARAMS = "parameters"
GRADS = "gradients"
OPTIM = "optimizer state"
COPIES = "autocast weight copies"
ACTS = "activations saved for backward"
INPUTS = "inputs saved for backward"
SCALER = "grad scaler state"
KAHAN = "Kahan compensation buffers"
ALLOC_PEAK = "allocator peak (this step)"
ALLOC_RESERVED = "allocator reserved peak (this step)"
GAP = "allocator and workspace"
RSS = "process memory (host RSS)"
KINDS = (PARAMS, GRADS, OPTIM, KAHAN, COPIES, ACTS, INPUTS, SCALER)

#: For the estimate where nothing ran (a simulated device): modules whose forward passes their
#: own parameters to an op autocast casts to the low dtype. A trace replaces it with what autocast
#: really cast; functional uses (Hugging Face's ``Conv1D`` calls ``addmm``) are beyond it.
LOW_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Bilinear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.PReLU,
    nn.MultiheadAttention,  # in_proj_weight / in_proj_bias (out_proj is a Linear of its own)
    nn.RNNCell,
    nn.LSTMCell,
    nn.GRUCell,
)
#: Parameters of a LOW_MODULES module that its forward does not hand to a cast op.
_NOT_CAST = frozenset({"bias_k", "bias_v"})
ESTIMATE = (
    "estimate, not a trace: the parameters of Linear / Conv / PReLU / MultiheadAttention / RNN "
    "cell modules in the autocast dtype, once each (functional uses such as Hugging Face's "
    "Conv1D are missed)"
)


def row(
    kind: str,
    dtype: Any,
    nbytes: int | None,
    expected: int | None,
    method: str,
    counted: bool = True,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "dtype": dtype if isinstance(dtype, str) or dtype is None else short(dtype),
        "bytes": nbytes,
        "expected_bytes": expected,
        "counted": counted,
        "method": method,
    }


def storage_bytes(tensors: Iterable[torch.Tensor]) -> dict[torch.dtype, int]:
    """Bytes by dtype of the distinct storages behind ``tensors`` (each storage once)."""
    seen: set[int] = set()
    out: dict[torch.dtype, int] = defaultdict(int)
    for t in tensors:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out[t.dtype] += storage.nbytes()
    return dict(out)


def numel_bytes(
    tensors: Iterable[torch.Tensor], dtype: torch.dtype | None = None
) -> dict[Any, int]:
    """Hand arithmetic: ``numel x element size`` by dtype (``dtype`` overrides the tensors')."""
    out: dict[Any, int] = defaultdict(int)
    for t in tensors:
        d = dtype or t.dtype
        out[d] += t.numel() * torch.empty((), dtype=d).element_size()
    return dict(out)


def _merge(kind: str, measured: dict[Any, int], expected: dict[Any, int], method: str) -> list:
    return [
        row(kind, d, measured.get(d), expected.get(d), method)
        for d in sorted(set(measured) | set(expected), key=str)
    ]


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def parameter_rows(model: nn.Module) -> list[dict[str, Any]]:
    params = list(model.parameters())
    return _merge(
        PARAMS, storage_bytes(params), numel_bytes(params), "storages of model.parameters()"
    )


def gradient_rows(model: nn.Module) -> list[dict[str, Any]]:
    params = trainable(model)
    grads = [p.grad for p in params if p.grad is not None]
    return _merge(
        GRADS,
        storage_bytes(grads),
        numel_bytes(params),
        "storages of p.grad after backward; expected: one gradient per trainable parameter",
    )


def adamw_expected(params: list[nn.Parameter], steps: bool = True) -> dict[Any, int]:
    """AdamW's state by hand: 2 x each parameter's bytes, plus one scalar ``step`` per tensor
    (``steps=False``: an optimizer that keeps its step count elsewhere, as torch-optimi does)."""
    expected = {d: 2 * n for d, n in numel_bytes(params).items()}
    if steps:  # the ``step`` counter: float64 when that is torch's default dtype, else fp32
        step = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        expected[step] = expected.get(step, 0) + len(params) * step.itemsize
    return expected


def expected_rows(model: nn.Module, plan: Any, method: str) -> list[dict[str, Any]]:
    """Hand arithmetic only (``bytes`` None): parameters, gradients, AdamW state, weight copies."""
    params = trainable(model)
    groups = (
        (PARAMS, numel_bytes(list(model.parameters()))),
        (GRADS, numel_bytes(params)),
        (OPTIM, adamw_expected(params)),
    )
    rows = [row(kind, d, None, n, method) for kind, by_dtype in groups for d, n in by_dtype.items()]
    for r in weight_copy_rows(model, (), plan):
        rows.append({**r, "method": f"{method}; {ESTIMATE}"})
    return rows


def optimizer_rows(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """AdamW state: ``exp_avg`` + ``exp_avg_sq`` per parameter (its dtype) + a scalar ``step``;
    a Kahan-summing optimizer's ``kahan_comp`` buffers (torch-optimi) are a kind of their own."""
    states = list(optimizer.state.values())
    items = [(k, v) for state in states for k, v in state.items() if torch.is_tensor(v)]
    tensors = [v for k, v in items if k != "kahan_comp"]
    kahan = [v for k, v in items if k == "kahan_comp"]
    keys = sorted({k for k, _ in items} - {"kahan_comp"})
    expected: dict[Any, int] = {}
    params = trainable(model)
    if isinstance(optimizer, torch.optim.AdamW) and not optimizer.defaults.get("amsgrad"):
        expected = adamw_expected(params)
    elif keys in (["exp_avg", "exp_avg_sq"], ["exp_avg", "exp_avg_sq", "step"]):
        expected = adamw_expected(params, steps="step" in keys)  # a library AdamW
    rows = _merge(
        OPTIM,
        storage_bytes(tensors),
        expected,
        f"storages of optimizer.state ({', '.join(keys)}) after one step; expected: AdamW "
        "exp_avg + exp_avg_sq per trainable parameter"
        + (" and one scalar step each" if "step" in keys else ""),
    )
    if kahan:
        rows += _merge(
            KAHAN,
            storage_bytes(kahan),
            numel_bytes(params),
            "storages of optimizer.state kahan_comp (torch-optimi, kahan_sum=True); expected: "
            "one buffer per trainable parameter, in its dtype",
        )
    return rows


def weight_copy_rows(
    model: nn.Module,
    copies: Iterable[tuple[torch.dtype, int]],
    plan: Any,
    cast: Iterable[tuple[torch.dtype, int]] | None = None,
) -> list[dict[str, Any]]:
    """Casts of parameters made inside the forward (autocast's weight cache), by dtype.

    ``copies``: (dtype, bytes) of each distinct output storage of a parameter cast (measured).
    ``cast``: (dtype, bytes) of each distinct parameter the trace saw autocast cast, from its shape
    (:meth:`OpTracer.parameter_casts`): the expectation. Without a trace (``cast`` None) the
    expectation is the module-level estimate (:data:`LOW_MODULES`), labelled so.
    """
    measured: dict[Any, int] = defaultdict(int)
    for dtype, nbytes in copies:
        measured[dtype] += nbytes
    if cast is not None:
        expected: dict[Any, int] = defaultdict(int)
        for dtype, nbytes in cast:
            expected[dtype] += nbytes
        how = (
            "expected: each parameter autocast cast in this trace once (a tied or reused weight "
            "once), numel x the cast dtype's size"
        )
    else:
        expected = estimate_weight_copies(model, plan)
        how = f"expected: {ESTIMATE}"
    if not measured and not expected:
        return []
    return _merge(
        COPIES,
        dict(measured),
        dict(expected),
        "outputs of _to_copy of a parameter's storage during the forward (each output storage "
        f"once); {how}",
    )


def estimate_weight_copies(model: nn.Module, plan: Any) -> dict[Any, int]:
    """The module-level estimate of autocast's weight copies (see :data:`ESTIMATE`)."""
    if not (getattr(plan, "autocast_enabled", False) and isinstance(plan.dtype, torch.dtype)):
        return {}
    seen: set[int] = set()
    low = []
    for module in model.modules():
        if isinstance(module, LOW_MODULES):
            for name, p in module.named_parameters(recurse=False):
                if name not in _NOT_CAST and id(p) not in seen:
                    seen.add(id(p))
                    low.append(p)
    return numel_bytes(low, plan.dtype)


def scaler_rows(tensors: Sequence[torch.Tensor]) -> list[dict[str, Any]]:
    """The grad scaler's device tensors (``Precision.state_tensors()``): the scale (fp32 scalar)
    and the growth tracker (int32); none without a scaler."""
    if not tensors:
        return []
    return _merge(
        SCALER,
        storage_bytes(tensors),
        {torch.float32: 4, torch.int32: 4},
        "GradScaler._scale and ._growth_tracker (torch's private fields, pinned by a test)",
    )


class SavedTensors(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks that note each saved storage once, by kind.

    A saved storage that is a parameter or a live autocast weight copy is already counted under
    that kind; one that belongs to the batch, or is a cast of it, is an input; every other one is
    an activation.
    """

    def __init__(self, param_storages: set[int], input_storages: set[int], tracer: Any) -> None:
        super().__init__(self._pack, lambda t: t)
        self.param_storages = param_storages
        self.input_storages = input_storages
        self.tracer = tracer
        #: each saved storage (by identity, as :mod:`.op_trace` keys it) -> its kind
        self.seen: dict[Any, tuple[str, torch.dtype, int]] = {}
        self.unattributed: dict[str, int] = defaultdict(int)

    def __enter__(self) -> SavedTensors:
        super().__enter__()
        return self

    def _pack(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.is_meta:
            what = type(t).__name__ if not isinstance(t, torch.Tensor) else str(t.layout)
            self.unattributed[f"saved {what}: no ordinary storage to measure"] += 1
            return t
        try:
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError) as exc:
            self.unattributed[f"saved {type(t).__name__}: {type(exc).__name__}"] += 1
            return t
        key = StorageWeakRef(storage)
        if key in self.seen:
            return t
        cast = self.tracer.copy_of(storage) if self.tracer is not None else None
        if ptr in self.param_storages:
            kind = PARAMS
        elif cast == "parameter":
            kind = COPIES
        elif ptr in self.input_storages or cast == "input":
            kind = INPUTS
        else:
            kind = ACTS
        self.seen[key] = (kind, t.dtype, nbytes)
        return t

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for kind, method in (
            (ACTS, "distinct storages packed by saved_tensors_hooks (views counted once)"),
            (INPUTS, "batch storages (or their autocast casts) the autograd graph saved"),
        ):
            by_dtype: dict[Any, int] = defaultdict(int)
            for k, dtype, nbytes in self.seen.values():
                if k == kind:
                    by_dtype[dtype] += nbytes
            out += [row(kind, d, n, None, method) for d, n in sorted(by_dtype.items(), key=str)]
        return out


def start_peak_window(device: torch.device) -> int:
    """CUDA: synchronize, reset the allocator's peak and return what is allocated now; else 0."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    base = int(torch.cuda.memory_allocated(device))
    torch.cuda.reset_peak_memory_stats(device)
    return base


def device_rows(device: torch.device, rows: list[dict[str, Any]], base: int) -> list:
    """Rows beside the sum of ``rows``: allocator peak and gap (CUDA), allocation (MPS), RSS."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = int(torch.cuda.max_memory_allocated(device)) - base
        reserved = int(torch.cuda.max_memory_reserved(device))
        counted = sum(r["bytes"] or 0 for r in rows if r["counted"])
        return [
            row(
                ALLOC_PEAK,
                None,
                peak,
                None,
                "torch.cuda.max_memory_allocated during the step, less what was allocated "
                "before it",
                counted=False,
            ),
            row(ALLOC_RESERVED, None, reserved, None, "torch.cuda.max_memory_reserved", False),
            row(
                GAP,
                None,
                peak - counted,
                None,
                "allocator peak less the sum of the kinds (negative: the kinds were not all "
                "alive at the peak)",
                counted=False,
            ),
        ]
    if device.type == "mps":
        allocated = int(torch.mps.current_allocated_memory())
        method = "torch.mps.current_allocated_memory after the step"
        return [row(ALLOC_PEAK, None, allocated, None, method, counted=False)]
    method = (
        "host RSS after the step: the whole process (Python, torch, libraries), not model memory"
    )
    return [row(RSS, None, host_rss(), None, method, counted=False)]
