"""Which gradients a real fp16 autocast step holds in fp16, read from an op trace of its forward.

A cast of a finished fp32 gradient to fp16 is a what-if. In a real fp16 autocast step a gradient
passes through fp16 whole only when the forward value it belongs to was fp16:

- a **parameter** that autocast casts to fp16 for an op (a ``Linear`` or convolution weight): the
  op's backward computes the gradient of the fp16 copy in fp16, and the cast's backward turns it
  into the fp32 ``.grad``. A parameter the forward uses in fp32 (an embedding table, norm
  weights) gets an fp32 gradient: whatever fp16 lost upstream reaches it only through fp32 ops,
  so a cast of its gradient says nothing about the real run. Used both ways (tied weights), its
  gradient is an fp32 sum with an fp16 part that an fp32 analysis cannot tell apart.
- a **module output** whose forward dtype is fp16 has an fp16 gradient; an fp32 output (a norm,
  an fp32 residual stream) has an fp32 one.

:func:`trace_fp16` runs one forward of the model under ``torch.autocast(device, float16)`` with
:class:`~precision_nb.engine.inspect.op_trace.OpTracer` (every ATen op after autocast's casts)
and forward hooks that name module outputs the way the numerics collector does. The policy is
the analysis device's (CPU autocast's lists differ from CUDA's for a few ops). When the forward
cannot run in fp16 there, the result carries the error and no dtypes: the caller counts every
gradient and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precision_nb.engine.inspect.op_trace import OpTracer, short
from precision_nb.engine.numerics.collect import hook_outputs

_SEEN = "_precision_nb_fp16_trace_seen"


def counted_in_fp16(held: str | None, traced: bool) -> bool:
    """The one rule every fp16 what-if of a gradient follows (the scale window, the report's
    answer): a gradient counts when a real fp16 step holds it in fp16 whole (``held``, the
    ``fp16_run`` column); when the trace failed (``traced`` False) every gradient counts, and the
    caller says so."""
    return held == "fp16" or not traced


@dataclass(frozen=True)
class Fp16Trace:
    """Per parameter name and module-output key, the dtype a real fp16 step holds it in."""

    params: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, str] = field(default_factory=dict)
    source: str = ""
    error: str | None = None


def trace_fp16(
    model: nn.Module, args: Any, kwargs: Mapping[str, Any], device: torch.device
) -> Fp16Trace:
    """One forward of ``model`` (modified as a forward modifies it: use a copy) under fp16
    autocast on ``device``, traced; see the module docstring."""
    source = (
        f"one forward under torch.autocast('{device.type}', float16), traced op by op "
        f"(torch {torch.__version__}, {device.type} autocast lists)"
    )
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(p.untyped_storage().data_ptr(), name)
    tracer = OpTracer(set(names))
    outputs: dict[str, str] = {}

    def note(_module: nn.Module, key: str, tensor: torch.Tensor) -> None:
        outputs.setdefault(key, short(tensor.dtype))

    handles = hook_outputs(model, _SEEN, note)
    try:
        with torch.enable_grad(), torch.autocast(device.type, dtype=torch.float16):
            if not torch.is_autocast_enabled(device.type):
                return Fp16Trace(
                    source=source, error=f"fp16 autocast is not available on {device.type}"
                )
            with tracer:
                model(*args, **kwargs)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return Fp16Trace(source=source, error=f"{type(exc).__name__}: {exc}".strip())
    finally:
        for handle in handles:
            handle.remove()
    params = {}
    for ptr, name in names.items():
        uses = tracer.param_uses.get(ptr)
        if uses:
            params[name] = "+".join(sorted(uses, key=lambda d: (d != "fp16", d)))
    return Fp16Trace(params, outputs, source)
