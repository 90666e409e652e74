"""A true plan's model and batches: cast in place, undone on failure, said in events.

A ``true`` plan (``bf16-true``) trains the model in the low dtype itself. :func:`cast_model`
casts every floating-point parameter and buffer in place (``nn.Module.to(dtype)``, which leaves
integer and bool buffers as they are: BatchNorm's ``num_batches_tracked`` stays int64) and returns
a :class:`ModelCast` that can put every tensor back in its own dtype, so a trainer whose optimizer
cannot be built leaves nothing half-cast. A complex parameter or buffer is refused before
anything is cast (``Module.to`` would fail part-way). :class:`CastBatches` casts the
floating-point tensors of every batch (inputs and float labels alike, as Lightning's true
precision does), so the first batch the loop measures, the FLOP count and the inspection step
see the same dtype the model has.

Decided once: after a true run, ``fit`` leaves the user's model in the plan's dtype, as it
leaves it on the device and as Lightning's ``bf16-true`` does. The trained values are bf16
numbers, so ``model.float()`` gives them back in fp32 exactly; the trainer keeps training the
same bf16 tensors its optimizer state belongs to. ``compare`` and ``profile`` train copies and
leave the user's model untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precision_nb.core.events import Event


@dataclass
class ModelCast:
    """What :func:`cast_model` did: the tensors' original dtypes (to undo it) and the events."""

    model: nn.Module
    dtype: torch.dtype | None
    original: dict[str, torch.dtype] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    def undo(self) -> None:
        """Put every cast parameter and buffer back in the dtype it had."""
        if self.dtype is None:
            return
        for name, tensor in _floating(self.model):
            before = self.original.get(name)
            if before is not None and tensor.dtype != before:
                tensor.data = tensor.data.to(before)


def _floating(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    named = [*model.named_parameters(), *model.named_buffers()]
    return [(n, t) for n, t in named if t is not None and t.is_floating_point()]


def cast_model(model: nn.Module, plan: Any) -> ModelCast:
    """Cast ``model`` in place for ``plan`` (nothing for a mixed plan); see module docstring.

    ``ValueError`` names a complex parameter or buffer (nothing is cast then).
    """
    if not getattr(plan, "true_weights", False):
        return ModelCast(model, None)
    dtype = plan.dtype
    named = [*model.named_parameters(), *model.named_buffers()]
    complex_ = [n for n, t in named if t is not None and t.is_complex()]
    if complex_:
        raise ValueError(
            f"model: {plan.label} cannot cast complex tensors ({', '.join(complex_[:5])}) to "
            f"{dtype}; allowed: a model whose parameters and buffers are real floating point "
            "(integer buffers are kept as they are), or a mixed plan"
        )
    cast = ModelCast(model, dtype, {n: t.dtype for n, t in _floating(model)})
    model.to(dtype)
    short = str(dtype).removeprefix("torch.")
    kept = [f"{n} ({str(t.dtype).removeprefix('torch.')})" for n, t in named
            if t is not None and not t.is_floating_point()]  # fmt: skip
    msg = (
        f"{plan.label}: the model's {len(cast.original)} floating-point parameters and buffers "
        f"are now {short}, in place; fit leaves them so (model.float() gives the trained values "
        "back in fp32 exactly)"
    )
    cast.events.append(Event("precision", msg, {"dtype": str(dtype), "cast": len(cast.original)}))
    if kept:
        cast.events.append(
            Event(
                "precision",
                f"{plan.label}: {len(kept)} non-floating buffer(s) stay as they are: "
                + ", ".join(kept[:5])
                + (" ..." if len(kept) > 5 else ""),
                {"kept": kept},
            )
        )
    return cast


def cast_floating(batch: Any, dtype: torch.dtype) -> Any:
    """``batch`` with its floating-point tensors in ``dtype`` (integer tensors untouched)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() and batch.dtype != dtype else batch
    if isinstance(batch, tuple):
        items = [cast_floating(b, dtype) for b in batch]
        return tuple(items) if type(batch) is tuple else type(batch)(*items)
    if isinstance(batch, list):
        return [cast_floating(b, dtype) for b in batch]
    if isinstance(batch, Mapping):
        return {k: cast_floating(v, dtype) for k, v in batch.items()}
    return batch


class CastBatches:
    """A batch source whose batches come out cast to a true plan's dtype (see
    :func:`cast_floating`); everything else is the wrapped source's."""

    def __init__(self, source: Any, dtype: torch.dtype) -> None:
        self.source, self.dtype = source, dtype

    def get(self, index: int) -> Any:
        return cast_floating(self.source.get(index), self.dtype)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)
