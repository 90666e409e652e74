"""compare(): several precision plans on one workload, same initial weights and data order.

Each request is resolved first; requests that resolve to the same plan (fp16 on CPU -> fp32) are
run once, and ``.merged`` / ``.events`` say why. Drift is measured against the fp32 run: the
final-loss difference and the relative L2 difference of all trainable parameters.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precision_nb.core import validate
from precision_nb.core.events import Event
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import explain_precision
from precision_nb.engine.batches import BatchSource
from precision_nb.engine.results import RunResult
from precision_nb.engine.trainer import TrainConfig, Trainer, make_train_config, prepare
from precision_nb.engine.workloads import DEFAULT_WORKLOAD, Workload

log = logging.getLogger(__name__)


@dataclass
class Comparison:
    """Results per label, drift from fp32, merged requests and events (in run order)."""

    results: dict[str, RunResult] = field(default_factory=dict)
    drift: dict[str, dict[str, float | None]] = field(default_factory=dict)
    merged: dict[str, str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    stopped: bool = False

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record of every run, in run order (the ``run`` key tells them apart)."""
        return [r for res in self.results.values() for r in res.records]


def _as_request(mode: Any, lab: bool) -> tuple[str, PrecisionConfig]:
    if isinstance(mode, PrecisionConfig):
        cfg = mode
    else:
        cfg = PrecisionConfig(
            mode=mode,
            loss_scale_lab=lab and str(mode).strip().lower() in ("fp16", "float16", "half"),
        )
    label = cfg.requested + (" (loss-scale lab)" if cfg.loss_scale_lab else "")
    return label, cfg


def _param_vector(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().cpu().reshape(-1) for p in model.parameters()])


def compare(
    modes: Sequence[Any] = ("fp32", "bf16", "fp16"),
    workload: str | Workload = DEFAULT_WORKLOAD,
    preset: str = "tiny",
    *,
    model: nn.Module | None = None,
    batches: Any = None,
    device: Any = "auto",
    optimizer: OptimizerConfig | None = None,
    train: TrainConfig | None = None,
    loss_scale_lab: bool = False,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    **train_options: Any,
) -> Comparison:
    """Train each requested precision on identical weights and data; see module docstring.

    ``modes``: mode strings or :class:`PrecisionConfig` values. ``loss_scale_lab=True`` turns a
    plain "fp16" request into the CPU loss-scale lab. With ``model`` (and ``batches``) your own
    model is copied for every run; otherwise the built-in ``workload`` at ``preset`` is used.
    ``loss_fn`` is passed to every run's :class:`Trainer`, as in ``fit()``.
    """
    if isinstance(modes, (str, PrecisionConfig)):
        modes = [modes]
    modes = list(modes)
    if not modes:
        raise ValueError("modes is empty; allowed: one or more of auto, fp32, bf16, fp16")
    validate.boolean("loss_scale_lab", loss_scale_lab)
    cfg = make_train_config(train, train_options)
    if model is not None and batches is None:
        raise ValueError("batches is None; pass batches together with your own model")
    model, batches, info = prepare(
        model if model is not None else workload, batches, preset, device, cfg.seed
    )
    if isinstance(batches, Iterable) and iter(batches) is batches:
        raise ValueError(
            f"batches has type {type(batches).__name__}, a one-shot iterator; compare needs "
            "batches it can replay for every plan: a callable, a DataLoader or a list"
        )
    initial = copy.deepcopy(model).cpu()
    out = Comparison()
    seen: dict[Any, str] = {}
    reference: torch.Tensor | None = None
    ref_label: str | None = None
    callbacks = list(callbacks)
    for mode in modes:
        label, request = _as_request(mode, loss_scale_lab)
        explanation = explain_precision(request, device, optimizer=optimizer)
        plan = explanation.plan
        if request.loss_scale_lab and not (explanation.row and explanation.row.source == "lab"):
            # The lab is a CPU opt-in; elsewhere (CUDA fp16 has the real scaler) the label must
            # not claim it.
            out.events.append(
                Event(
                    "fallback",
                    f"{label}: the loss-scale lab applies to fp16 on CPU only; on "
                    f"{explanation.device} this runs as plain {request.requested}",
                    {"field": "loss_scale_lab", "requested": True, "used": False, "run": label},
                )
            )
            label = request.requested
        if label in out.results or label in out.merged:
            out.events.append(
                Event(
                    "merged", f"{label}: requested twice; run once", {"label": label, "into": label}
                )
            )
            continue
        if plan in seen:
            first = seen[plan]
            out.merged[label] = first
            reasons = explanation.fallbacks or explanation.decisions
            why = "; ".join(d.reason for d in reasons if d.field != "device")
            out.events.append(
                Event(
                    "merged",
                    f"{label} resolves to the same plan as {first} ({plan.mode} on "
                    f"{explanation.device}); run once. Why: {why}",
                    {"label": label, "into": first, "why": why},
                )
            )
            continue
        if out.stopped:
            out.events.append(
                Event(
                    "stop",
                    f"{label}: not run (comparison stopped)",
                    {"run": label, "reason": "stopped"},
                )
            )
            continue
        seen[plan] = label
        run_model = copy.deepcopy(initial)
        trainer = Trainer(
            run_model,
            BatchSource(batches),
            device=device,
            precision=request,
            optimizer=optimizer,
            train=dataclasses.replace(cfg, label=label),
            loss_fn=loss_fn,
            workload_info=info,
        )
        result = trainer.fit(callbacks=callbacks, stop=stop)
        out.results[label] = result
        out.events.extend(e.prefixed(label) for e in result.events)
        params = _param_vector(run_model)
        if plan.mode == "fp32" and reference is None:
            reference, ref_label = params, label
        out.drift[label] = {"params": params}  # type: ignore[dict-item]
        if result.stopped:
            out.stopped = True
    for label, d in out.drift.items():
        params = d.pop("params")  # type: ignore[arg-type]
        ref = out.results[ref_label] if ref_label else None
        if reference is None or ref is None:
            d.update(final_loss_diff=None, param_rel_diff=None)
            continue
        loss, ref_loss = out.results[label].final_loss, ref.final_loss
        d["final_loss_diff"] = None if loss is None or ref_loss is None else loss - ref_loss
        denom = float(reference.norm()) or 1.0
        d["param_rel_diff"] = float((params - reference).norm()) / denom
    if reference is None:
        out.events.append(Event("warning", "no fp32 run among the requests: drift is None"))
    return out
