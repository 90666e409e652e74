"""Statistics of one tensor at a time, and hooks that collect them for module outputs.

Every statistic stays on the device until :func:`to_host` brings a whole tree of them home in one
transfer. Each tensor is analysed when it exists (an activation in its forward hook, its gradient
in a tensor hook during backward) and nothing is kept of it but counts, so the analysis holds no
extra copy of activations or gradients.

Activation gradients covered: the gradient of every floating-point tensor that a module's
``forward`` returns (directly, or as an item of a tuple, list or dict) and that requires grad,
under the name of the innermost module that returned it (a container returning its last child's
output counts once, under the child). Not covered: intermediate values inside a module's forward
(e.g. attention scores inside ``scaled_dot_product_attention``, a residual sum that is not a
module's output), the model's inputs, and outputs a module modifies in place later.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from precision_nb.engine.numerics.formats import count_casts, magnitudes
from precision_nb.engine.numerics.fp8 import FP8_FORMATS, merge, scaled_error
from precision_nb.engine.numerics.scale_window import subnormal_error_sums, sweep_counts

_SEEN = "_precision_nb_numerics_seen"

#: Which activation gradients are covered, in words (the module docstring says it in full).
COVERAGE = (
    "the gradient of every floating-point tensor a module returns (directly or in a tuple, list "
    "or dict) that requires grad, named after the innermost module returning it; not covered: "
    "values inside a module's forward that no module returns, and the model inputs"
)


def variants(formats: Sequence[str], scale: float) -> list[tuple[str, str, float | None]]:
    """``(label, format, scale)`` per column: fp16 appears unscaled and at the loss scale."""
    out: list[tuple[str, str, float | None]] = []
    for name in formats:
        out.append((name, name, None))
        if name == "fp16":
            k = math.log2(scale)
            label = f"fp16 x2^{int(k)}" if k == int(k) else f"fp16 x{scale:g}"
            out.append((label, "fp16", scale))
    return out


def gradient_stats(g: torch.Tensor, formats: Sequence[str], scale: float) -> dict[str, Any]:
    """Cast counts per variant, the scale sweep and the fp8 scaled error of one gradient."""
    m = magnitudes(g)
    specs = variants(formats, scale)
    counts = count_casts(m, [(name, s) for _, name, s in specs])
    out: dict[str, Any] = {"counts": {label: counts[i] for i, (label, _, _) in enumerate(specs)}}
    out["sweep"] = sweep_counts(m)
    out["sweep_error"] = subnormal_error_sums(m)
    out["live"] = m.elements - m.dead
    out["fp8"] = {f: scaled_error(m, f) for f in formats if f in FP8_FORMATS}
    return out


def value_stats(x: torch.Tensor, formats: Sequence[str]) -> dict[str, Any]:
    """fp8 cast counts (unscaled) and scaled error of a weight or an activation."""
    fp8 = [f for f in formats if f in FP8_FORMATS]
    m = magnitudes(x)
    counts = count_casts(m, [(f, None) for f in fp8])
    return {
        "counts": {f: counts[i] for i, f in enumerate(fp8)},
        "fp8": {f: scaled_error(m, f) for f in fp8},
    }


def _add(a: Any, b: Any) -> Any:
    """Sum two stats trees of one module called twice (fp8 errors merged with their amax)."""
    if a is None:
        return b
    out: dict[str, Any] = {}
    for key, value in b.items():
        if key == "fp8":
            out[key] = {f: merge(a[key].get(f), v) for f, v in value.items()}
        elif isinstance(value, dict):
            out[key] = {k: a[key][k] + v for k, v in value.items()}
        else:
            out[key] = a[key] + value
    return out


@dataclass
class OutputStats:
    """What was collected for one module output name."""

    name: str
    module: str
    shape: tuple[int, ...]
    elements: int = 0
    calls: int = 0
    value: Any = None
    grad: Any = None
    grad_elements: int = 0


@dataclass
class ActivationCollector:
    """Forward hooks on every module; each new output gets a tensor hook for its gradient."""

    formats: Sequence[str]
    scale: float
    outputs: dict[str, OutputStats] = field(default_factory=dict)
    _handles: list[Any] = field(default_factory=list)

    def attach(self, model: nn.Module) -> None:
        self._handles += hook_outputs(model, _SEEN, self._on_output)

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _on_output(self, module: nn.Module, key: str, tensor: torch.Tensor) -> None:
        stats = self.outputs.get(key)
        if stats is None:
            stats = OutputStats(key, type(module).__name__, tuple(tensor.shape))
            self.outputs[key] = stats
        stats.calls += 1
        stats.elements += tensor.numel()
        with torch.no_grad():
            stats.value = _add(stats.value, value_stats(tensor, self.formats))
        tensor.register_hook(self._grad_hook(stats))

    def _grad_hook(self, stats: OutputStats) -> Any:
        def hook(grad: torch.Tensor) -> None:
            with torch.no_grad():
                stats.grad = _add(stats.grad, gradient_stats(grad, self.formats, self.scale))
            stats.grad_elements += grad.numel()

        return hook


def hook_outputs(
    model: nn.Module, mark: str, on_output: Callable[[nn.Module, str, torch.Tensor], None]
) -> list[Any]:
    """Forward hooks on every module of ``model`` (their handles): each calls ``on_output(module,
    key, tensor)`` for each floating-point tensor of the module's output that requires grad and
    that no module (an inner one, whose hook ran first) has claimed under ``mark`` yet."""

    def hook_for(name: str) -> Any:
        def hook(module: nn.Module, _inputs: Any, output: Any) -> None:
            for suffix, tensor in _tensors(output):
                if not getattr(tensor, mark, False):
                    setattr(tensor, mark, True)
                    on_output(module, name + suffix, tensor)

        return hook

    return [m.register_forward_hook(hook_for(n or "(model)")) for n, m in model.named_modules()]


def _tensors(output: Any) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(output, torch.Tensor):
        items: Any = [("", output)]
    elif isinstance(output, (tuple, list)):
        items = [(f"[{i}]", t) for i, t in enumerate(output)]
    elif isinstance(output, Mapping):
        items = [(f"[{k!r}]", t) for k, t in output.items()]
    else:
        items = []
    for suffix, t in items:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            yield suffix, t


def to_host(tree: Any) -> Any:
    """The same tree (dicts) with every tensor replaced by Python floats (0-dim), a list (1-dim)
    or a list of rows (2-dim), in one transfer (tensors must share a device)."""
    leaves = [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]
    values = iter(
        torch.cat([t.detach().double().flatten() for t in leaves]).tolist() if leaves else []
    )

    def rebuild(node: Any) -> Any:
        if not isinstance(node, torch.Tensor):
            return node
        out = list(itertools.islice(values, node.numel()))
        if node.dim() == 0:
            return out[0]
        if node.dim() == 2:
            return [out[i : i + node.shape[1]] for i in range(0, len(out), node.shape[1])]
        return out

    return tree_map(rebuild, tree)
