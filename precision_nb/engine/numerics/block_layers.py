"""Per GEMM layer: what each block-scaled recipe does to the tensors it really casts.

A linear layer's training step runs three GEMMs, and the MX and NVFP4 recipes (torchao's
``MXLinear``, Transformer Engine's ``MXFP8BlockScaling`` / ``NVFP4BlockScaling``) cast each GEMM's
two inputs along that GEMM's reduction dimension, while every GEMM writes its output in high
precision (bf16 or fp32):

- forward ``Y = X W^T``: the input X (M x K) and the weight W (N x K), blocks along K;
- input gradient ``dX = dY W``: the output gradient dY (M x N) and W, blocks along N;
- weight gradient ``dW = dY^T X``: dY and X, blocks along M. Its output, the weight gradient,
  is not cast (a row says so).

:class:`BlockCollector` casts each of these six operands to every requested block format in the
tensor hook that receives the GEMM's output gradient during backward (the weight once per step)
and keeps only sums (``block_stats``), like the rest of the analysis; operands with the same
number of columns go through one torchao call per format. A layer's input is held until then,
as autograd holds it for the weight gradient; an output that gets no gradient is cast at once.
Each is also cast to bf16 and to per-tensor fp8 (torchao.float8's recipe, ``fp8.scaled_error``)
for the comparison columns. A convolution is treated as its implicit GEMM with channels last:
blocks run along the input channels of each pixel (forward), the output channels (input
gradient) and the batch x pixels (weight gradient); no library ships block-scaled convolution
training, so its rows are what such a kernel would cast. NVFP4 here is torchao's cast, 1 x 16
blocks with round to nearest: Transformer Engine's NVFP4 recipe also uses 16 x 16 weight blocks,
random Hadamard transforms on the weight-gradient GEMM's inputs and stochastic rounding of
gradients, which are not simulated.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from precision_nb.core.text import times_text
from precision_nb.engine.numerics.block_stats import (
    block_stats_many,
    estimate,
    reference_stats,
    relative,
)
from precision_nb.engine.numerics.blocks import BLOCK_FORMATS, torchao_api, torchao_notes
from precision_nb.engine.numerics.formats import magnitudes
from precision_nb.engine.numerics.fp8 import merge, relative_error, scaled_error
from precision_nb.engine.numerics.gemm_shapes import (
    RULE_TEXT,
    SHAPE_RULES,
    Gemm,
    GemmTracer,
    Operands,
    family_of,
    qualifying_share,
    shape_rows,
    untraced_layers,
)

#: (tensor, GEMM, dimension the blocks run along) of every cast of a linear layer's step.
CASTS: tuple[tuple[str, str, str], ...] = (
    ("input", "forward", "K"),
    ("weight", "forward", "K"),
    ("weight", "input_grad", "N"),
    ("output_grad", "input_grad", "N"),
    ("input", "weight_grad", "M"),
    ("output_grad", "weight_grad", "M"),
)
WEIGHT_GRAD_NOTE = (
    "output of the weight-gradient GEMM: written in high precision (bf16/fp32), not cast by the "
    "block-scaled recipes"
)
#: A layer is kept in bf16 when its worst error exceeds this multiple of the model's median.
KEEP_FACTOR = 2.0
KEEP_RULE = (
    "kept in bf16: (1) the first and the last GEMM layer of the step, the recipes' convention "
    "(torchtitan's float8 and MX converters leave the final projection 'output' out by default; "
    "DeepSeek-V3's FP8 training keeps the embedding and output head in higher precision; "
    "NVIDIA's NVFP4 pretraining recipe keeps the first and last blocks' linear layers in BF16); "
    "(2) a layer whose worst relative error over its casts exceeds "
    f"{times_text(KEEP_FACTOR, 'g')} the model's median for that format; (3) a layer whose K or N "
    "breaks the format's shape rule "
    "(unless it is padded)"
)


def operand_views(ops: Operands, tensor: str, along: str) -> torch.Tensor:
    """The 2-D matrix whose rows are blocked for one cast of :data:`CASTS` (last dimension =
    the dimension the blocks run along)."""
    if not ops.conv:
        matrix = {"input": ops.x, "weight": ops.w}.get(tensor)
        if matrix is None:
            matrix = ops.out.reshape(-1, ops.out.shape[-1])
        natural = "N" if tensor == "output_grad" else "K"  # X: M x K, W: N x K, dY: M x N
        return (matrix if along == natural else matrix.t()).contiguous()
    return _conv_view(ops, tensor, along)


def _conv_view(ops: Operands, tensor: str, along: str) -> torch.Tensor:
    x, w, dy = ops.x, ops.w, ops.out
    groups = x.shape[1] // w.shape[1]
    if tensor == "input":
        if along == "K":  # channels of each pixel, per group
            return x.movedim(1, -1).reshape(-1, w.shape[1])
        return x.transpose(0, 1).reshape(x.shape[1], -1)
    if tensor == "weight":
        if along == "K":
            return w.movedim(1, -1).reshape(-1, w.shape[1])
        per_group = w.reshape(groups, w.shape[0] // groups, -1).transpose(1, 2)
        return per_group.reshape(-1, w.shape[0] // groups)
    if along == "N":
        return dy.movedim(1, -1).reshape(-1, dy.shape[1] // groups)
    return dy.transpose(0, 1).reshape(dy.shape[1], -1)


class BlockCollector:
    """Traces the forward's GEMMs and collects block statistics of their operands.

    ``tracer`` is the mode to run the forward under; ``stats`` (layer -> device tensors) is
    what :func:`block_rows` turns into rows after one host transfer."""

    def __init__(self, model: torch.nn.Module, formats: Sequence[str]) -> None:
        self.formats = list(formats)
        self.refs = sorted({BLOCK_FORMATS[f].fp8_reference for f in self.formats})
        self.stats: dict[str, dict[str, Any]] = {}
        self.tracer = GemmTracer(model, self._on_gemm)

    def _add(self, layer: dict[str, Any], key: str, value: torch.Tensor) -> None:
        old = layer.get(key)
        layer[key] = value if old is None else old + value

    def _reference(self, layer: dict[str, Any], tensor: str, t: torch.Tensor) -> None:
        self._add(layer, f"{tensor}|bf16", reference_stats(t))
        m = magnitudes(t)  # shared by the per-tensor fp8 casts
        for ref in self.refs:
            layer[f"{tensor}|{ref}"] = merge(layer.get(f"{tensor}|{ref}"), scaled_error(m, ref))

    def _cast(self, layer: dict[str, Any], ops: Operands, casts: list[tuple[str, str]]) -> None:
        """Cast the operands ``casts`` ((tensor, blocks along) pairs of one GEMM call) to every
        format; those sharing their number of columns in one torchao call per format."""
        views = [operand_views(ops, tensor, along) for tensor, along in casts]
        for (tensor, along), stats in zip(
            casts, block_stats_many(views, self.formats), strict=True
        ):
            for f, values in zip(self.formats, stats, strict=True):
                self._add(layer, f"{tensor}|{along}|{f}", values)

    def _on_gemm(self, gemm: Gemm, ops: Operands) -> None:
        layer = self.stats.setdefault(gemm.layer, {})
        first = gemm.calls == 1  # the weight is the same in every call of one forward
        casts = [("input", "K"), ("input", "M")]
        if first:
            casts += [("weight", "K"), ("weight", "N")]
        with torch.no_grad():
            self._reference(layer, "input", ops.x)
            if first:
                self._reference(layer, "weight", ops.w)
        if ops.out.requires_grad:  # cast with the output gradient: fewer, larger torchao calls
            ops.out.register_hook(self._grad_hook(layer, ops.x, ops.w, ops.conv, casts))
        else:
            with torch.no_grad():
                self._cast(layer, ops, casts)

    def _grad_hook(
        self, layer: dict[str, Any], x: Any, w: Any, conv: int, casts: list[tuple[str, str]]
    ) -> Any:
        def hook(grad: torch.Tensor) -> None:
            with torch.no_grad():
                done = Operands(x, w, grad, conv)
                self._cast(layer, done, [*casts, ("output_grad", "N"), ("output_grad", "M")])
                self._reference(layer, "output_grad", grad)

        return hook


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def block_rows(
    gemms: Mapping[str, Gemm], host: Mapping[str, Mapping[str, Any]], formats: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per GEMM layer, cast and format, and the weight gradient's "not cast" row."""
    rows = []
    for g in sorted(gemms.values(), key=lambda g: g.order):
        stats = host.get(g.layer, {})
        for f in formats:
            fmt = BLOCK_FORMATS[f]
            for tensor, gemm_name, along in (*CASTS, ("weight_grad", "weight_grad", None)):
                base = {
                    "layer": g.layer,
                    "tensor": tensor,
                    "gemm": gemm_name,
                    "blocks_along": along,
                    "format": f,
                    "block": fmt.block,
                    "scale_format": fmt.scale,
                }
                if along is None:
                    rows.append({**base, "status": "not cast", "note": WEIGHT_GRAD_NOTE})
                    continue
                values = stats.get(f"{tensor}|{along}|{f}")
                if values is None:  # e.g. an output the loss does not reach: no gradient
                    status = "no gradient" if tensor == "output_grad" else "not seen"
                    rows.append({**base, "status": status})
                    continue
                est = estimate(values)
                bf16 = stats.get(f"{tensor}|bf16")
                ref = stats.get(f"{tensor}|{fmt.fp8_reference}")
                rel = est["rel_error"]
                bf16_rel = relative(*bf16) if bf16 else None
                fp8_rel = relative_error(ref) if ref else None
                rows.append(
                    {
                        **base,
                        "status": "ok",
                        **est,
                        "bf16_rel_error": bf16_rel,
                        "fp8_reference": fmt.fp8_reference,
                        "fp8_rel_error": fp8_rel,
                        "vs_bf16": _ratio(rel, bf16_rel),
                        "vs_fp8": _ratio(rel, fp8_rel),
                    }
                )
    return rows


def keep_in_bf16(
    rows: Sequence[Mapping[str, Any]], shapes: Sequence[Mapping[str, Any]], formats: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Per format: the layers :data:`KEEP_RULE` keeps in bf16 (with their reasons), and the
    share of the traced GEMMs' step FLOPs that stays in the low-precision format."""
    order = [s["layer"] for s in shapes]
    flops = {s["layer"]: s["step_flops"] for s in shapes}
    total = sum(flops.values())
    out: dict[str, dict[str, Any]] = {}
    for f in formats:
        family = family_of(f)
        worst: dict[str, float] = {}
        for r in rows:
            if r["format"] == f and r.get("rel_error") is not None:
                worst[r["layer"]] = max(worst.get(r["layer"], 0.0), r["rel_error"])
        median = statistics.median(worst.values()) if worst else None
        reasons: dict[str, list[str]] = {}
        for i, layer in enumerate(order):
            why = []
            if i == 0:
                why.append("first GEMM layer")
            if i == len(order) - 1:
                why.append("last GEMM layer")
            err = worst.get(layer)
            if median and err is not None and err > KEEP_FACTOR * median:
                why.append(f"error {err:.3g} > {KEEP_FACTOR:g} x median {median:.3g}")
            shape = next(s for s in shapes if s["layer"] == layer)
            if not shape[f"{family}_qualifies"]:
                why.append(f"K={shape['K']}, N={shape['N']} not multiples of "
                           f"{SHAPE_RULES[family]} (unless padded)")  # fmt: skip
            if why:
                reasons[layer] = why
        kept = sum(flops[k] for k in reasons)
        out[f] = {
            "rule": KEEP_RULE,
            "median_error": median,
            "keep": [{"layer": k, "reasons": v} for k, v in reasons.items()],
            "low_precision_layers": [k for k in order if k not in reasons],
            "low_precision_flop_share": (total - kept) / total if total else None,
        }
    return out


NO_GEMM_REASON = (
    "no linear or convolution layer ran a GEMM with one of the model's parameters as its weight "
    "in the traced forward: there is nothing a block-scaled or fp8 recipe would cast"
)


def block_result(
    collector: BlockCollector, host: Mapping[str, Any], model: torch.nn.Module
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Rows and summary of a :class:`BlockCollector` after the step (``host``: its ``stats``
    brought to the host): the ``blocks`` and ``gemms`` rows, and the info: ``keep`` (per format,
    see :func:`keep_in_bf16`), the qualifying FLOP share per shape rule, what was not traced."""
    gemms = collector.tracer.gemms
    shapes = shape_rows(gemms)
    rows = block_rows(gemms, host, collector.formats)
    for r in rows:
        if r.get("padded"):
            r["note"] = (
                f"last dimension padded with {r['padded']} zeros to a multiple of {r['block']}"
            )
    info: dict[str, Any] = {
        "formats": collector.formats,
        "keep": keep_in_bf16(rows, shapes, collector.formats),
        "qualifying_share": {f: qualifying_share(shapes, f) for f in SHAPE_RULES},
        "shape_rules": dict(RULE_TEXT),
        "untraced": untraced_layers(model, gemms),
        "skipped_calls": list(collector.tracer.skipped),
        "torchao": {"version": torchao_api().version, "import_notes": torchao_notes()},
        "reason": None if shapes else NO_GEMM_REASON,
    }
    return rows, shapes, info
