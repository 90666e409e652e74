"""Which GEMMs of the user's model could run in a low-precision format: shapes from the step.

:class:`GemmTracer` (a ``TorchFunctionMode``) watches one forward and records every call of
``F.linear``, ``torch.addmm``, ``torch.matmul`` / ``mm`` / ``@`` and ``F.conv1d/2d/3d`` that
uses one of the model's parameters as its weight (``nn.Linear``, Hugging Face's ``Conv1D``, a
tied LM head, torchvision's convolutions): the GEMM's (M, K, N) as it ran, with ``M`` the rows
(tokens, or batch x output pixels for a convolution's implicit GEMM), ``K`` the reduction and
``N`` the output features. ``nn.MultiheadAttention`` computes its projections inside
``F.multi_head_attention_forward``, which the mode sees as one call and does not enter: its
weights are listed as not traced (:func:`untraced_layers`).

Shape rules (:data:`SHAPE_RULES`): a per-tensor fp8 GEMM (``torch._scaled_mm``) needs K and N
multiples of 16; MX formats block K (and, for the input-gradient GEMM, N) in 32s; NVFP4 in 16s.
The weight-gradient GEMM reduces over M, so a recipe that casts along M needs M a multiple of the
block too: M is the batch's rows, a choice of batch size rather than of the layer, and is
reported apart. Padding to the next multiple costs the padded FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

#: Block (multiple) each family needs on K and N (and M for the weight-gradient GEMM).
SHAPE_RULES: Mapping[str, int] = {"fp8": 16, "mx": 32, "nvfp4": 16}
#: What each rule is, in words.
RULE_TEXT: Mapping[str, str] = {
    "fp8": "per-tensor fp8 (torch._scaled_mm): K and N multiples of 16",
    "mx": "MX (32-element blocks along the reduction): K and N multiples of 32",
    "nvfp4": "NVFP4 (16-element blocks along the reduction): K and N multiples of 16",
}

_CONVS = {F.conv1d: 1, F.conv2d: 2, F.conv3d: 3}
_MATMULS = (torch.matmul, torch.mm, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.mm)


@dataclass
class Gemm:
    """One traced GEMM of a layer (shapes of its last call; ``calls`` and ``m_total`` add up)."""

    layer: str
    op: str
    m: int
    k: int
    n: int
    groups: int = 1
    calls: int = 0
    m_total: int = 0
    order: int = 0

    @property
    def flops(self) -> int:
        """Forward FLOPs of every call (2 M K N per group)."""
        return 2 * self.m_total * self.k * self.n * self.groups


@dataclass
class Operands:
    """The tensors of one GEMM call as the recipes cast them: ``x`` rows x K, ``w`` N x K (for a
    convolution, channels last: blocks run along the input channels), ``out`` the GEMM's
    output, ``conv`` its spatial rank (0 for a matrix multiply)."""

    x: torch.Tensor
    w: torch.Tensor
    out: torch.Tensor
    conv: int = 0


def _param_index(model: nn.Module) -> dict[Any, tuple[str, nn.Parameter]]:
    """Each weight (2-D or more) by identity and by storage, named after its module; a weight
    tied to an embedding (GPT-2's LM head) is named after the module that is no embedding."""
    index: dict[Any, tuple[str, nn.Parameter]] = {}
    owners: dict[int, nn.Module] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for pname, p in module.named_parameters(recurse=False):
            if p.dim() < 2:
                continue
            if id(p) in owners and not isinstance(owners[id(p)], nn.Embedding):
                continue
            owners[id(p)] = module
            name = f"{prefix}.{pname}" if prefix else pname
            index[id(p)] = (name, p)
            index[(p.untyped_storage().data_ptr(), p.numel())] = (name, p)
    return index


class GemmTracer(TorchFunctionMode):
    """Records the model's GEMMs during a forward (``gemms``: layer -> :class:`Gemm`);
    ``on_gemm(gemm, operands)`` (optional) gets each call's tensors to analyse (the mode is off
    while it runs); ``skipped`` says which calls could not be read, and why."""

    def __init__(
        self, model: nn.Module, on_gemm: Callable[[Gemm, Operands], None] | None = None
    ) -> None:
        super().__init__()
        self.on_gemm = on_gemm
        self.gemms: dict[str, Gemm] = {}
        self.skipped: list[str] = []
        self._index = _param_index(model)

    def _find(self, t: Any) -> tuple[str, nn.Parameter] | None:
        if not isinstance(t, torch.Tensor) or t.dim() < 2:
            return None
        hit = self._index.get(id(t))
        if hit is None and t.device.type != "meta":
            hit = self._index.get((t.untyped_storage().data_ptr(), t.numel()))
        return hit

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            found = self._match(func, args, kwargs, out)
        except (IndexError, RuntimeError, ValueError) as err:  # an unusual call: say so, go on
            found = None
            self.skipped.append(f"{getattr(func, '__name__', func)}: {err}")
        if found is not None:
            self._record(*found)
        return out

    def _match(self, func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return None
        if func is F.linear:
            x, w = args[0], args[1] if len(args) > 1 else kwargs.get("weight")
            hit = self._find(w)
            if hit is None or w.dim() != 2:
                return None
            return hit, "linear", Operands(x.reshape(-1, x.shape[-1]), w, out)
        if func is torch.addmm:
            x, w = (args[1], args[2]) if len(args) > 2 else (kwargs["mat1"], kwargs["mat2"])
            hit = self._find(w)
            return None if hit is None else (hit, "addmm", Operands(x, w.t(), out))
        if func in _MATMULS and len(args) >= 2:
            x, w = args[0], args[1]
            hit = self._find(w)
            if hit is None or w.dim() != 2 or not isinstance(x, torch.Tensor):
                return None
            return hit, "matmul", Operands(x.reshape(-1, x.shape[-1]), w.t(), out)
        rank = _CONVS.get(func)
        if rank:
            w = args[1] if len(args) > 1 else kwargs.get("weight")
            hit = self._find(w)
            return None if hit is None else (hit, f"conv{rank}d", Operands(args[0], w, out, rank))
        return None

    def _record(self, hit: tuple[str, nn.Parameter], op: str, ops: Operands) -> None:
        name = hit[0].removesuffix(".weight") or hit[0]
        if ops.conv:
            groups = ops.x.shape[1] // ops.w.shape[1]
            m = ops.out.shape[0] * math.prod(ops.out.shape[2:])
            k = ops.w.shape[1] * math.prod(ops.w.shape[2:])
            n = ops.w.shape[0] // groups
        else:
            groups, (m, k), n = 1, ops.x.shape, ops.w.shape[0]
        gemm = self.gemms.get(name)
        if gemm is None:
            gemm = Gemm(name, op, m, k, n, groups, order=len(self.gemms))
            self.gemms[name] = gemm
        gemm.m, gemm.k, gemm.n, gemm.groups = m, k, n, groups
        gemm.calls += 1
        gemm.m_total += m
        if self.on_gemm is not None:
            self.on_gemm(gemm, ops)


def untraced_layers(model: nn.Module, traced: Mapping[str, Gemm]) -> list[str]:
    """Modules whose projections run inside a call the tracer does not enter
    (``nn.MultiheadAttention``)."""
    return [
        name or "(model)"
        for name, m in model.named_modules()
        if isinstance(m, nn.MultiheadAttention) and not any(k.startswith(name) for k in traced)
    ]


def padding(value: int, multiple: int) -> int:
    """How much ``value`` needs to reach the next multiple of ``multiple``."""
    return (-value) % multiple


def shape_rows(gemms: Mapping[str, Gemm]) -> list[dict[str, Any]]:
    """One row per traced GEMM layer: (M, K, N), FLOPs of a training step (forward, input
    gradient and weight gradient: 3 x 2 M K N), and per rule family whether K and N qualify,
    the padding K, N and M would need and the FLOPs padding adds."""
    rows = []
    for g in sorted(gemms.values(), key=lambda g: g.order):
        row: dict[str, Any] = {
            "layer": g.layer,
            "op": g.op,
            "calls": g.calls,
            "M": g.m_total,
            "K": g.k,
            "N": g.n,
            "groups": g.groups,
            "step_flops": 3 * g.flops,
        }
        for family, b in SHAPE_RULES.items():
            pk, pn, pm = padding(g.k, b), padding(g.n, b), padding(g.m_total, b)
            row[f"{family}_qualifies"] = pk == 0 and pn == 0
            row[f"{family}_pad_K"] = pk
            row[f"{family}_pad_N"] = pn
            row[f"{family}_pad_M"] = pm
            padded = (g.m_total + pm) * (g.k + pk) * (g.n + pn) * g.groups * 6
            row[f"{family}_padding_flops"] = padded - 3 * g.flops
        rows.append(row)
    return rows


def qualifying_share(rows: list[dict[str, Any]], family: str) -> float | None:
    """Of the traced GEMMs' step FLOPs, the share whose K and N meet ``family``'s rule."""
    total = sum(r["step_flops"] for r in rows)
    if not total:
        return None
    return sum(r["step_flops"] for r in rows if r[f"{family}_qualifies"]) / total


def family_of(fmt: str) -> str:
    """The shape-rule family of a format name (``fp8_e4m3`` -> fp8, ``mxfp4`` -> mx)."""
    if fmt.startswith("mx"):
        return "mx"
    if fmt.startswith("nvfp4"):
        return "nvfp4"
    return "fp8"
