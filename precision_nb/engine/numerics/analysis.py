"""One instrumented fp32 step on a deep copy: gradients, activations, scale window, fp8, stagnation.

:func:`analyze` never touches the caller's training state: it works on a deep copy of the model
(and of the optimizer with its state, when one is given), under ``torch.random.fork_rng`` so the
caller's random stream continues as if nothing ran. Results are plain rows (lists of dicts); the
views turn them into DataFrames and figures.

Memory: :data:`MEMORY_NOTE`; every other statistic is computed one tensor at a time (a few
temporaries the size of that tensor) and kept only as counts.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precision_nb.core.device import resolve_device
from precision_nb.core.events import Event
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import resolve_precision
from precision_nb.core.validate import number
from precision_nb.engine.batches import BatchSource, output_to_loss, split_batch, to_device
from precision_nb.engine.numerics import rows as R
from precision_nb.engine.numerics.block_layers import BlockCollector, block_result
from precision_nb.engine.numerics.blocks import resolve_formats, torchao_api
from precision_nb.engine.numerics.collect import (
    COVERAGE,
    ActivationCollector,
    gradient_stats,
    to_host,
    value_stats,
)
from precision_nb.engine.numerics.formats import overflow_behaviour
from precision_nb.engine.numerics.fp8 import hardware_note
from precision_nb.engine.numerics.fp16_run import Fp16Trace, trace_fp16
from precision_nb.engine.numerics.scale_window import DEFAULT_THRESHOLD, sweep_rows, window
from precision_nb.engine.numerics.stagnation import WEIGHT_FORMATS, lost_updates
from precision_nb.engine.precision import Precision
from precision_nb.engine.request import prepare

DEFAULT_FORMATS: tuple[str, ...] = ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
#: The loss scale fp16 counts use when none is given: GradScaler's default init_scale.
DEFAULT_SCALE = 2.0**16

MEMORY_NOTE = (
    "Works on a deep copy of the model (and optimizer state); holds at most one extra copy of the "
    "gradients at a time (the weights before the step, to measure the update), and afterwards, "
    "for one fp16 autocast forward of the copy, that forward's activations."
)


@dataclass
class NumericsResult:
    """Plain rows of one analysis; ``info`` says how they were made."""

    gradients: list[dict[str, Any]] = field(default_factory=list)
    activations: list[dict[str, Any]] = field(default_factory=list)
    scale_window: list[dict[str, Any]] = field(default_factory=list)
    window: dict[str, Any] = field(default_factory=dict)
    fp8: list[dict[str, Any]] = field(default_factory=list)
    stagnation: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Event] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    #: Block-scaled formats (empty unless one was asked for): per GEMM layer, cast and format;
    #: the traced GEMMs' shapes; and ``blocks_info`` (keep-in-bf16 lists, FLOP shares, notes).
    blocks: list[dict[str, Any]] = field(default_factory=list)
    gemms: list[dict[str, Any]] = field(default_factory=list)
    blocks_info: dict[str, Any] = field(default_factory=dict)


def analyze(
    model: nn.Module | Any,
    batches: Any = None,
    *,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    formats: Sequence[Any] = DEFAULT_FORMATS,
    device: Any = "auto",
    scale: float | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    optimizer: torch.optim.Optimizer | OptimizerConfig | None = None,
    preset: str = "tiny",
    seed: int = 0,
) -> NumericsResult:
    """Analyse one batch of ``model`` (a module, a built-in workload or its name) in fp32.

    ``formats``: names from :data:`~precision_nb.engine.numerics.formats.FORMATS` and the
    block-scaled :data:`~precision_nb.engine.numerics.blocks.BLOCK_FORMATS` (torchao's casts,
    the ``blocks`` extra; ``ImportError`` naming it when torchao is missing). ``scale``: the
    loss scale of the fp16 "at scale" column (default 2^16). ``threshold``: the largest underflowed
    fraction the safe window accepts. ``optimizer``: the caller's optimizer (its state is copied,
    the analysis runs where the model's parameters are), an ``OptimizerConfig`` or ``None`` (a
    fresh AdamW with default settings: its first step moves a weight by ``lr * |g| / (|g| + eps)``
    plus the weight decay ``lr * weight_decay * w``, so a weight with a zero gradient moves by
    the decay alone).
    """
    if isinstance(formats, (str, torch.dtype)):
        formats = (formats,)
    formats, block = resolve_formats(formats)
    if not formats and not block:
        raise ValueError("formats: invalid value () (tuple); allowed: at least one format")
    if block:
        torchao_api()  # ImportError naming the extra before anything runs
    scale = DEFAULT_SCALE if scale is None else number("scale", scale, minimum=0.0, strict=True)
    threshold = number("threshold", threshold, minimum=0.0, maximum=1.0)
    if optimizer is not None and not isinstance(
        optimizer, (torch.optim.Optimizer, OptimizerConfig)
    ):
        raise ValueError(
            f"optimizer has type {type(optimizer).__name__}; allowed: a torch.optim.Optimizer, "
            "an OptimizerConfig or None"
        )
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        model, batches, workload = prepare(model, batches, preset, device, seed)
        if not isinstance(model, nn.Module):
            raise ValueError(f"model has type {type(model).__name__}; allowed: a torch.nn.Module")
        return _run(
            model, batches, loss_fn, formats, device, scale, threshold, optimizer, workload, block
        )


def _run(
    model: nn.Module,
    batches: Any,
    loss_fn: Any,
    formats: list[str],
    device: Any,
    scale: float,
    threshold: float,
    optimizer: Any,
    workload: Any,
    block: list[str],
) -> NumericsResult:
    """The analysis of ``model`` on its first batch (see :func:`analyze`), inside its RNG fork."""
    twin, opt, where = _copy(model, optimizer, device)
    twin.zero_grad(set_to_none=True)
    batch = to_device(BatchSource(batches).get(0), where)
    # the step runs through the fp32 precision a run of this plan uses
    amp = Precision.for_plan(resolve_precision(PrecisionConfig(mode="fp32"), where), where)
    collector = ActivationCollector(formats, scale)
    collector.attach(twin)
    blocks = BlockCollector(twin, block) if block else None
    try:
        args, kwargs, labels = split_batch(batch, twin, loss_fn)
        # fp32 even inside a caller's autocast region
        with torch.autocast(where.type, enabled=False), amp.forward_context():
            with blocks.tracer if blocks is not None else contextlib.nullcontext():
                out = twin(*args, **kwargs)
            loss, _task = output_to_loss(out, labels, loss_fn)
        loss = loss.float()
        amp.backward(loss)
    finally:
        collector.detach()
    params = list(twin.named_parameters())
    with torch.no_grad():
        host = to_host(
            {
                "loss": loss.detach(),
                "params": {
                    n: {
                        "value": value_stats(p, formats),
                        "grad": gradient_stats(p.grad, formats, scale),
                    }
                    for n, p in params
                    if p.grad is not None
                },
                "stagnation": _stagnation(params, opt, amp),
                "blocks": blocks.stats if blocks is not None else {},
                "outputs": {
                    k: {"value": o.value, "grad": o.grad} for k, o in collector.outputs.items()
                },
            }
        )
    trace = trace_fp16(twin, args, kwargs, where)
    held_p = {n: trace.params.get(n) for n, _ in params}
    held_a = {k: trace.outputs.get(k) for k in collector.outputs}
    result = NumericsResult()
    result.gradients = R.gradient_rows(params, host["params"], formats, scale, held_p)
    result.activations = R.activation_rows(
        collector.outputs, host["outputs"], formats, scale, held_a
    )
    result.fp8 = R.fp8_rows(params, collector.outputs, host, formats)
    result.stagnation = R.stagnation_rows(params, host["stagnation"])
    if blocks is not None:
        result.blocks, result.gemms, result.blocks_info = block_result(blocks, host["blocks"], twin)
    p_in, p_all = R.sweep_totals(host["params"], held_p, trace.error is None)
    a_in, a_all = R.sweep_totals(host["outputs"], held_a, trace.error is None)
    result.scale_window = sweep_rows(p_in, a_in, threshold, every=p_all + a_all)
    result.window = window(result.scale_window, threshold)
    counted, every = p_in.tensors + a_in.tensors, p_all.tensors + a_all.tensors
    result.window.update(_basis(trace, counted, every))
    if not trace.error and counted == 0 and every:
        result.window["reason"] = (
            "a real fp16 step holds no gradient in fp16 (autocast keeps every one in fp32), so "
            "a loss scale has nothing to protect"
        )
    loss_value = float(host["loss"])
    result.findings = R.findings(result, loss_value, scale, trace.error)
    result.info = {
        "model": type(model).__name__,
        "workload": workload,
        "device": str(where),
        "loss": loss_value if math.isfinite(loss_value) else None,
        "formats": formats + block,
        "scale": scale,
        "threshold": threshold,
        "overflow_behaviour": {f: overflow_behaviour(f) for f in formats},
        "optimizer": _optimizer_text(optimizer, opt),
        "coverage": COVERAGE,
        "fp8": hardware_note(),
        "fp16_run": {"source": trace.source, "error": trace.error},
        "memory": MEMORY_NOTE,
    }
    return result


def _copy(model: nn.Module, optimizer: Any, device: Any) -> tuple[nn.Module, Any, torch.device]:
    if isinstance(optimizer, torch.optim.Optimizer):
        twin, opt = copy.deepcopy((model, optimizer))  # one memo: the state follows the params
        first = next(twin.parameters(), None)
        return twin, opt, first.device if first is not None else torch.device("cpu")
    where = resolve_device(device)
    twin = copy.deepcopy(model).to(where)
    cfg = optimizer if isinstance(optimizer, OptimizerConfig) else OptimizerConfig()
    params = [p for p in twin.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    return twin, opt, where


def _basis(trace: Fp16Trace, counted: int, every: int) -> dict[str, Any]:
    """What the window counts: the gradients a real fp16 step holds in fp16, or, when the fp16
    trace failed, every gradient (and why)."""
    if trace.error:
        text = (
            f"every gradient ({every} tensors): the fp16 trace that tells which ones a real fp16 "
            f"step holds in fp16 failed ({trace.error})"
        )
    elif counted == every:
        text = (
            f"all {every} gradient tensors: a real fp16 autocast step holds each of them in fp16 "
            "(parameters autocast casts to fp16, fp16 module outputs)"
        )
    else:
        text = (
            f"the {counted} of {every} gradient tensors a real fp16 autocast step holds in fp16 "
            "(parameters autocast casts to fp16, fp16 module outputs); the others stay fp32 "
            "there and are left out"
        )
    return {"basis": text, "counted_tensors": every if trace.error else counted, "tensors": every}


def _stagnation(params: list[tuple[str, nn.Parameter]], opt: Any, amp: Precision) -> dict[str, Any]:
    """Step the copy's optimizer once; per parameter ``[updated, lost]`` in bf16 and fp16."""
    stepped = [(n, p) for n, p in params if p.grad is not None]
    before = [p.detach().clone() for _, p in stepped]  # the one extra gradient-sized copy
    amp.step(opt)
    return {
        n: {f: lost_updates(old, p, f) for f in WEIGHT_FORMATS}
        for (n, p), old in zip(stepped, before, strict=True)
    }


def _optimizer_text(requested: Any, opt: Any) -> str:
    group = opt.param_groups[0] if opt.param_groups else {}
    lr = float(group.get("lr", float("nan")))
    if isinstance(requested, torch.optim.Optimizer):
        return f"the given {type(opt).__name__} with its state, one step (lr {lr:g})"
    return (
        f"a fresh AdamW, its first step (lr {lr:g}: a weight moves by lr * |g| / (|g| + eps) plus "
        "the weight decay, by the decay alone where its gradient is 0)"
    )
