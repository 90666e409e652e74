"""Host statistics -> plain rows (lists of dicts) and findings (typed events)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch import nn

from precision_nb.core.events import Event
from precision_nb.engine.numerics.collect import OutputStats, variants
from precision_nb.engine.numerics.formats import COUNT_FIELDS, counts_row
from precision_nb.engine.numerics.fp8 import FP8_FORMATS, recipe_role, relative_error
from precision_nb.engine.numerics.fp16_run import counted_in_fp16
from precision_nb.engine.numerics.scale_window import SweepTotal
from precision_nb.engine.numerics.stagnation import WEIGHT_FORMATS

_EMPTY = {k: None for k in counts_row([0] * len(COUNT_FIELDS), 1)}


def _status(p: nn.Parameter, has_grad: bool) -> str:
    if not p.requires_grad:
        return "frozen"
    return "ok" if has_grad else "no gradient"


def _count_rows(
    base: dict[str, Any], stats: Mapping[str, Any] | None, elements: int, formats, scale
) -> list[dict[str, Any]]:
    rows = []
    for label, name, s in variants(formats, scale):
        row = {**base, "variant": label, "format": name, "scale": 1.0 if s is None else s}
        if stats is None:
            row.update(_EMPTY, elements=elements)
        else:
            row.update(counts_row(stats["counts"][label], elements))
        rows.append(row)
    return rows


def gradient_rows(
    params: Sequence[tuple[str, nn.Parameter]],
    host: Mapping[str, Any],
    formats,
    scale,
    held: Mapping[str, str | None],
) -> list[dict[str, Any]]:
    """One row per parameter tensor and format variant; status ok / no gradient / frozen;
    ``fp16_run``: the dtype a real fp16 autocast step holds the gradient in (``held``)."""
    rows = []
    for name, p in params:
        stats = host.get(name)
        base = {
            "layer": name,
            "shape": tuple(p.shape),
            "status": _status(p, stats is not None),
            "fp16_run": held.get(name),
        }
        rows += _count_rows(
            base, None if stats is None else stats["grad"], p.numel(), formats, scale
        )
    return rows


def activation_rows(
    outputs: Mapping[str, OutputStats],
    host: Mapping[str, Any],
    formats,
    scale,
    held: Mapping[str, str | None],
) -> list[dict[str, Any]]:
    """One row per module output and format variant (status "no gradient" when backward never
    reached it, e.g. an output the loss does not use); ``fp16_run`` as for parameters."""
    rows = []
    for key, out in outputs.items():
        grad = host[key]["grad"]
        base = {
            "layer": key,
            "module": out.module,
            "shape": out.shape,
            "calls": out.calls,
            "status": "ok" if grad is not None else "no gradient",
            "fp16_run": held.get(key),
        }
        rows += _count_rows(base, grad, out.grad_elements or out.elements, formats, scale)
    return rows


def _fp8_row(layer: str, tensor: str, fmt: str, stats: Mapping[str, Any], elements: int) -> dict:
    err = stats["fp8"][fmt]
    unscaled = counts_row(stats["counts"][fmt], elements)
    live = unscaled["live"]
    return {
        "layer": layer,
        "tensor": tensor,
        "format": fmt,
        "recipe": recipe_role(tensor, fmt),
        "amax": err[0],
        "rel_error": relative_error(err),
        "underflow_scaled_fraction": err[3] / live if live else None,
        "underflow_unscaled_fraction": unscaled["underflow_fraction"],
        "overflow_unscaled_fraction": unscaled["overflow_fraction"],
    }


def fp8_rows(
    params: Sequence[tuple[str, nn.Parameter]],
    outputs: Mapping[str, OutputStats],
    host: Mapping[str, Any],
    formats: Sequence[str],
) -> list[dict[str, Any]]:
    """Per layer and fp8 format: weights and weight gradients, activations and their gradients."""
    fp8 = [f for f in formats if f in FP8_FORMATS]
    rows = []
    for name, p in params:
        stats = host["params"].get(name)
        if stats is None:
            continue
        for f in fp8:
            rows.append(_fp8_row(name, "weight", f, stats["value"], p.numel()))
            rows.append(_fp8_row(name, "weight_grad", f, stats["grad"], p.numel()))
    for key, out in outputs.items():
        stats = host["outputs"][key]
        for f in fp8:
            rows.append(_fp8_row(key, "activation", f, stats["value"], out.elements))
            if stats["grad"] is not None:
                rows.append(_fp8_row(key, "activation_grad", f, stats["grad"], out.grad_elements))
    return rows


def stagnation_rows(
    params: Sequence[tuple[str, nn.Parameter]], host: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Per parameter and weight format: non-zero updates, and those a low-precision weight loses."""
    rows = []
    for name, p in params:
        stats = host.get(name)
        for f in WEIGHT_FORMATS:
            row: dict[str, Any] = {"layer": name, "format": f, "elements": p.numel()}
            row["status"] = _status(p, stats is not None)
            updated, lost = (int(v) for v in stats[f]) if stats else (None, None)
            row.update(updated=updated, lost=lost)
            row["lost_fraction"] = lost / updated if updated else None
            rows.append(row)
    return rows


def sweep_totals(
    host: Mapping[str, Any], held: Mapping[str, str | None], traced: bool
) -> tuple[SweepTotal, SweepTotal]:
    """Host gradient sweeps of ``host`` (name -> ``{"grad": stats or None}``) summed: those
    :func:`counted_in_fp16` counts (``held``: the fp16 trace's dtypes), and every one."""
    inside, every = SweepTotal(), SweepTotal()
    for name, stats in host.items():
        if stats["grad"] is None:
            continue
        every.add(stats["grad"])
        if counted_in_fp16(held.get(name), traced):
            inside.add(stats["grad"])
    return inside, every


def _layers(rows: Iterable[Mapping[str, Any]], test: Any) -> list[str]:
    return list(dict.fromkeys(r["layer"] for r in rows if test(r)))


def _first_five(names: list[str]) -> str:
    return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")


def findings(result: Any, loss: float, scale: float, trace_error: str | None) -> list[Event]:
    """What a user should know: non-finite values, missing gradients, no window, overflow, no
    GEMM for the block formats, a failed fp16 trace."""
    out: list[Event] = []

    def warn(text: str, data: dict[str, Any]) -> None:
        out.append(Event("warning", text, data))

    if not loss == loss or loss in (float("inf"), float("-inf")):
        warn(
            f"The fp32 loss is {loss}: every gradient below follows from it.",
            {"finding": "nonfinite_loss", "loss": str(loss)},
        )
    for kind, rows in (("parameter", result.gradients), ("activation", result.activations)):
        bad = _layers(rows, lambda r: (r.get("nonfinite") or 0) > 0)
        if bad:
            warn(
                f"Non-finite fp32 {kind} gradients (inf/NaN before any cast) in "
                f"{len(bad)} tensor(s): {_first_five(bad)}; "
                "they are left out of the fractions and the window.",
                {"finding": "nonfinite_gradients", "kind": kind, "layers": bad},
            )
    for status, what in (
        ("no gradient", "got no gradient (unused in the loss)"),
        ("frozen", "are frozen"),
    ):
        names = _layers(result.gradients, lambda r, s=status: r["status"] == s)
        if names:
            warn(
                f"{len(names)} parameter tensor(s) {what}: {_first_five(names)}; shown as such, "
                "not as underflow.",
                {"finding": status.replace(" ", "_"), "layers": names},
            )
    if result.window.get("lo") is None:
        warn(
            f"No safe fp16 loss-scale window: {result.window.get('reason')}.",
            {"finding": "no_window", **result.window},
        )
    over = _layers(
        result.gradients + result.activations,
        lambda r: (
            r["format"] == "fp16"
            and r["scale"] == scale
            and scale != 1.0
            and (r.get("overflow") or 0) > 0
        ),
    )
    if over:
        warn(
            f"At loss scale {scale:g}, fp16 gradients overflow in {len(over)} tensor(s): "
            f"{_first_five(over)}.",
            {"finding": "overflow_at_scale", "scale": scale, "layers": over},
        )
    if result.blocks_info.get("reason"):
        warn(f"Block formats: {result.blocks_info['reason']}.", {"finding": "no_gemm"})
    if trace_error:
        warn(
            f"Which gradients a real fp16 step holds in fp16 could not be traced ({trace_error}): "
            "the window counts every gradient, also those autocast would keep in fp32.",
            {"finding": "fp16_trace_failed", "error": trace_error},
        )
    return out
