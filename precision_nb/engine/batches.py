"""Batch sources (iterable, DataLoader, callable) and model-output -> loss adapters.

A batch is a tensor, a tuple/list of tensors ``(inputs, labels)`` (the model gets the inputs) or
a mapping of tensors (the model gets them as keyword arguments). A mapping's ``"labels"`` entry is
handed to the model as its library does it (Hugging Face: labels in, ``.loss`` out) when the
model's ``forward`` has a ``labels`` parameter and no ``loss_fn`` is given; otherwise it is kept
out of the call. The model output may be

- a scalar loss tensor,
- a mapping (or object) with a ``loss`` entry,
- logits with labels from the batch: ``(N, C)`` logits with ``(N,)`` integer labels -> cross
  entropy; ``(N, T, V)`` logits with ``(N, T)`` labels -> causal LM (position t predicts label
  t + 1, the Hugging Face convention: labels are the input ids, the shift happens here; -100 is
  ignored, as in cross entropy).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Batch = Any


class BatchesExhausted(Exception):
    """Raised by a one-shot batch source that has no more batches (handled by the trainer)."""


def _check_batch(batch: Any, index: int) -> None:
    ok = isinstance(batch, torch.Tensor)
    if isinstance(batch, (tuple, list)):
        ok = len(batch) > 0 and isinstance(batch[0], torch.Tensor)
    elif isinstance(batch, Mapping):
        ok = any(isinstance(v, torch.Tensor) for v in batch.values())
    if not ok:
        raise ValueError(
            f"batch {index} has type {type(batch).__name__}; allowed: a tensor, a tuple/list "
            "whose first item is a tensor (inputs, labels), or a mapping of tensors"
        )


class BatchSource:
    """Hands out batches by global microbatch index, from a callable or a (re-)iterable."""

    def __init__(self, batches: Any) -> None:
        self._fn: Callable[[int], Any] | None = None
        self._iterable: Iterable[Any] | None = None
        self._it: Iterator[Any] | None = None
        self.one_shot = False
        if callable(batches) and not hasattr(batches, "__iter__"):
            self._fn = batches
        elif isinstance(batches, Iterable) and not isinstance(
            batches, (torch.Tensor, str, bytes, Mapping)
        ):
            self._iterable = batches
            self.one_shot = iter(batches) is batches  # generators / iterators cannot restart
        else:
            raise ValueError(
                f"batches has type {type(batches).__name__}; allowed: an iterable of batches, "
                "a DataLoader, or a callable taking the microbatch index"
            )
        self._served = 0

    def get(self, index: int) -> Any:
        """Return the batch for microbatch ``index`` (cycling through a re-iterable source)."""
        batch = self._fn(index) if self._fn is not None else self._next()
        if batch is None:  # a cheap check on every batch: None would fail deep in the model
            raise ValueError(
                f"batches returned None for microbatch {index}; allowed: a tensor, a tuple/list "
                "(inputs, labels) or a mapping of tensors (raise StopIteration or end the "
                "iterable to stop early)"
            )
        if self._served == 0:
            _check_batch(batch, index)
        self._served += 1
        return batch

    def _next(self) -> Any:
        assert self._iterable is not None
        if self._it is None:
            self._it = iter(self._iterable)
        try:
            return next(self._it)
        except StopIteration:
            if self._served == 0:
                raise ValueError("batches is empty: the source yielded no batch") from None
            if self.one_shot:
                raise BatchesExhausted from None
            self._it = iter(self._iterable)  # next epoch
            try:
                return next(self._it)
            except StopIteration:
                raise BatchesExhausted from None


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a batch to ``device`` (non-blocking; a no-op when already there)."""
    if isinstance(batch, torch.Tensor):
        # ``Tensor.to`` is a dispatcher round trip even when nothing moves; a tensor already on
        # the device (the built-in workloads place their data there once) is returned as is.
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, tuple):
        items = [to_device(b, device) for b in batch]
        return tuple(items) if type(batch) is tuple else type(batch)(*items)  # namedtuples too
    if isinstance(batch, list):
        return [to_device(b, device) for b in batch]
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def split_batch(
    batch: Any, model: Any = None, loss_fn: Any = None
) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
    """Return ``(args, kwargs, labels)`` for the model call (see the module docstring)."""
    if isinstance(batch, torch.Tensor):
        return (batch,), {}, None
    if isinstance(batch, (tuple, list)):
        if len(batch) == 1:
            return (batch[0],), {}, None
        return tuple(batch[:-1]), {}, batch[-1]
    labels = batch.get("labels")
    if labels is not None and loss_fn is None and model is not None and takes_labels(model):
        return (), dict(batch), labels
    kwargs = {k: v for k, v in batch.items() if k != "labels"}
    return (), kwargs, labels


def takes_labels(model: Any) -> bool:
    """Whether ``model``'s ``forward`` names a ``labels`` parameter (Hugging Face models do).

    Wrappers whose ``forward`` takes only ``*args, **kwargs`` (DistributedDataParallel's
    ``.module``, ``torch.compile``'s ``._orig_mod``) are looked through.
    """
    for _ in range(4):
        params = _forward_parameters(type(model))
        if "labels" in params:
            return True
        if any(kind not in _VARIADIC for kind in params.values()):
            return False
        inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return False
        model = inner
    return False


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@functools.lru_cache(maxsize=64)
def _forward_parameters(cls: type) -> dict[str, Any]:
    forward = getattr(cls, "forward", None)
    if forward is None:
        return {}
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a builtin without a signature: nothing to read
        return {}
    return {name: p.kind for name, p in params.items() if name != "self"}


@dataclass(frozen=True)
class BatchShape:
    """Sizes of one microbatch, taken from the first one: samples, tokens (token-id inputs
    only), signature."""

    samples: int
    tokens: int | None
    signature: tuple[Any, ...]


def batch_shape(batch: Any, task: str | None = None) -> BatchShape:
    """Samples, tokens and the shape signature of one microbatch.

    ``tokens`` is read from the batch alone, so it does not depend on having run the model: the
    positions of the model's input when that is an integer tensor of two or more dimensions
    (token ids, ``input_ids`` in a mapping; padding included), else, for a ``task`` of
    ``"causal_lm"``, the labels' positions; None otherwise.
    """
    tensors = _tensors(batch)
    first = tensors[0]
    samples = int(first.shape[0]) if first.dim() > 0 else 1
    args, kwargs, labels = split_batch(batch)
    model_input = kwargs.get("input_ids", args[0] if args else next(iter(kwargs.values()), None))
    tokens = None
    if _token_ids(model_input):
        tokens = int(model_input.numel())
    elif task == "causal_lm":
        ref = labels if isinstance(labels, torch.Tensor) else first
        tokens = int(ref.numel())
    sig = tuple((tuple(t.shape), str(t.dtype)) for t in tensors)
    return BatchShape(samples, tokens, sig)


def _token_ids(t: Any) -> bool:
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        return False
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    items = batch.values() if isinstance(batch, Mapping) else batch
    return [t for t in items if isinstance(t, torch.Tensor)]


def _arity(fn: Callable[..., Any]) -> int:
    """Number of parameters of ``fn`` (looked up once per hashable callable: not per step)."""
    try:
        return _arity_cached(fn)
    except TypeError:  # an unhashable callable object
        return len(inspect.signature(fn).parameters)


@functools.lru_cache(maxsize=64)
def _arity_cached(fn: Callable[..., Any]) -> int:
    return len(inspect.signature(fn).parameters)


def output_to_loss(
    output: Any, labels: Any, loss_fn: Callable[..., torch.Tensor] | None = None
) -> tuple[torch.Tensor, str]:
    """Turn a model output into ``(scalar loss, task)``; task is custom, loss, classification or
    causal_lm (a model's own loss beside logits shaped like one of the last two is named so)."""
    if loss_fn is not None:
        n = _arity(loss_fn)
        return (loss_fn(output, labels) if n >= 2 else loss_fn(output)), "custom"
    if type(output) is torch.Tensor:  # the common case first: no mapping/attribute probing
        if output.dim() == 0:
            return output, "loss"
        return _logits_loss(output, labels)
    loss, logits = None, output
    if isinstance(output, Mapping):
        loss, logits = output.get("loss"), output.get("logits")
    elif not isinstance(output, torch.Tensor) and hasattr(output, "loss"):
        loss, logits = getattr(output, "loss", None), getattr(output, "logits", None)
    if isinstance(loss, torch.Tensor):
        return loss, _task_of(logits, labels)
    if isinstance(logits, torch.Tensor) and logits.dim() == 0:
        return logits, "loss"
    if not isinstance(logits, torch.Tensor):
        raise ValueError(
            f"model output has type {type(output).__name__}; allowed: a scalar loss tensor, a "
            "mapping with 'loss', or logits (with labels in the batch)"
        )
    return _logits_loss(logits, labels)


def _task_of(logits: Any, labels: Any) -> str:
    if isinstance(logits, torch.Tensor) and isinstance(labels, torch.Tensor):
        if logits.dim() == 3 and labels.dim() == 2:
            return "causal_lm"
        if logits.dim() == 2 and labels.dim() == 1 and not labels.dtype.is_floating_point:
            return "classification"
    return "loss"


def _logits_loss(logits: torch.Tensor, labels: Any) -> tuple[torch.Tensor, str]:
    if not isinstance(labels, torch.Tensor):
        raise ValueError(
            f"model returned logits of shape {tuple(logits.shape)} but the batch has no labels; "
            "pass (inputs, labels), a mapping with 'labels', or a loss_fn"
        )
    if logits.dim() == 3 and labels.dim() == 2:
        v = logits.shape[-1]
        shifted = logits[:, :-1, :].reshape(-1, v)
        return F.cross_entropy(shifted.float(), labels[:, 1:].reshape(-1)), "causal_lm"
    if logits.dim() == 2 and labels.dim() == 1:
        if labels.dtype.is_floating_point or labels.dtype == torch.bool:
            raise ValueError(
                f"logits of shape {tuple(logits.shape)} with {str(labels.dtype)[6:]} labels of "
                f"shape {tuple(labels.shape)}: the built-in classification loss (cross entropy) "
                "needs integer class labels; pass loss_fn for regression or other targets (a "
                "model that takes labels and returns .loss computes its own)"
            )
        return F.cross_entropy(logits.float(), labels), "classification"
    raise ValueError(
        f"logits of shape {tuple(logits.shape)} with labels of shape {tuple(labels.shape)}: "
        "allowed (N, C) with (N,) for classification or (N, T, V) with (N, T) for a causal LM; "
        "pass loss_fn for anything else"
    )
