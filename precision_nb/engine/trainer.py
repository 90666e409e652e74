"""The trainer: ``Trainer`` (fit, sessions, checkpoints) and ``fit()``.

One ``fit()`` is a :class:`~precision_nb.engine.session.FitSession`: ``start()`` (a fresh
precision step with its grad scaler, restored scaler state from a checkpoint loaded since the
previous fit, the plan's fallbacks and the autocast check as events), ``advance(all)`` (the loop)
and ``finish()``. Precision in the loop is one :class:`~precision_nb.engine.amp_step.AmpStep`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from precision_nb.core.device import resolve_device
from precision_nb.core.events import Event
from precision_nb.core.optim import OptimizerConfig, build_optimizer
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import explain_precision
from precision_nb.core.validate import short_repr
from precision_nb.engine import checkpoint as ckpt
from precision_nb.engine.amp_step import AmpStep
from precision_nb.engine.batches import BatchSource
from precision_nb.engine.results import RunResult
from precision_nb.engine.run_setup import seed_everything
from precision_nb.engine.session import FitSession
from precision_nb.engine.train_config import TrainConfig, lr_factor
from precision_nb.engine.workloads import Workload, get_workload

__all__ = [
    "FitSession",
    "TrainConfig",
    "Trainer",
    "fit",
    "lr_factor",
    "make_train_config",
    "prepare",
    "seed_everything",
]

if TYPE_CHECKING:
    from precision_nb.core.distributed import Distributed
    from precision_nb.engine.distributed.results import DistributedResult

log = logging.getLogger(__name__)


def _move_model(model: nn.Module, device: torch.device) -> None:
    """Move ``model`` to ``device``; on any failure move it back, so it is never half-moved."""
    first = next(model.parameters(), None)
    original = first.device if first is not None else torch.device("cpu")
    try:
        model.to(device)
    except BaseException:
        model.to(original)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise


class Trainer:
    """Trains ``model`` on ``batches`` under a resolved precision plan; see module docstring."""

    def __init__(
        self,
        model: nn.Module,
        batches: Any,
        *,
        device: Any = "auto",
        precision: PrecisionConfig | str | None = None,
        optimizer: OptimizerConfig | None = None,
        train: TrainConfig | None = None,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        workload_info: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"model has type {type(model).__name__}; allowed: a torch.nn.Module")
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError(
                f"model {type(model).__name__} has no trainable parameters "
                "(none with requires_grad=True); nothing to train"
            )
        self.train = train if train is not None else TrainConfig()
        if not isinstance(self.train, TrainConfig):
            raise ValueError(f"train has type {type(train).__name__}; allowed: TrainConfig or None")
        self.precision = (
            precision
            if isinstance(precision, PrecisionConfig)
            else PrecisionConfig(mode=precision if precision is not None else "auto")
        )
        self.optimizer_config = optimizer if optimizer is not None else OptimizerConfig()
        self.explanation = explain_precision(
            self.precision, device, optimizer=self.optimizer_config
        )
        self.plan = self.explanation.plan
        self.device = torch.device(self.explanation.device)
        self.model = model
        self.source = batches if isinstance(batches, BatchSource) else BatchSource(batches)
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError(
                f"loss_fn: invalid value {short_repr(loss_fn)} ({type(loss_fn).__name__}); "
                "allowed: None or a callable (output, target) -> scalar loss tensor"
            )
        self.loss_fn = loss_fn
        self.workload_info = dict(workload_info or {})
        _move_model(model, self.device)
        self.optimizer = build_optimizer(model, self.optimizer_config, self.device)
        self.optimizer_outcome = getattr(self.optimizer, "precision_nb_fused", None)
        self.steps_done = 0
        self.attempts_done = 0
        self.microbatches_done = 0
        self.amp: AmpStep | None = None  # the last fit's precision step
        self._pending_scaler: dict[str, Any] | None = None
        self._pending_events: list[Event] = []
        self._task: str | None = None
        self.last_result: RunResult | None = None

    # ----------------------------------------------------------------------------- helpers

    @property
    def lab(self) -> bool:
        return bool(self.precision.loss_scale_lab and self.plan.use_scaler)

    @property
    def fused(self) -> bool:
        return bool(getattr(self.optimizer_outcome, "used", False))

    @property
    def scaler(self) -> Any:
        """The last fit's grad scaler (None before a fit or without one)."""
        return self.amp.scaler if self.amp is not None else None

    def scale_value(self) -> float | None:
        """The grad scaler's current loss scale (a host read; for inspection, not the loop)."""
        return self.amp.scale_value() if self.amp is not None else None

    def _new_result(self, label: str) -> RunResult:
        return RunResult(
            label=label,
            plan=self.plan,
            explanation=self.explanation,
            optimizer_outcome=self.optimizer_outcome,
            device=str(self.device),
        )

    def _record_base(self, label: str) -> dict[str, Any]:
        p = self.plan.to_dict()
        return {
            "run": label,
            "mode": p["mode"],
            "dtype": p["dtype"],
            "use_scaler": p["use_scaler"],
            "autocast_enabled": p["autocast_enabled"],
            "device_type": p["device_type"],
            "device": str(self.device),
            "fused_adamw": self.fused,
            "loss_scale_lab": self.lab,
        }

    # --------------------------------------------------------------------------- fitting

    def fit(
        self,
        steps: int | None = None,
        *,
        callbacks: Sequence[Any] = (),
        stop: Any = None,
    ) -> RunResult:
        """Run ``steps`` counted optimizer steps (default ``train.steps``); returns a RunResult.

        ``callbacks``: objects with any of ``on_fit_start(result)``, ``on_log(record)``,
        ``on_fit_end(result)``. ``stop``: a ``threading.Event``-like object (``is_set()``)
        checked between steps; Ctrl-C stops the same way. Either way ``result.stopped`` is True
        and every record made so far is kept. Same as ``start()``, ``advance(all)``, ``finish()``.
        """
        session = self.start(steps, callbacks=callbacks, stop=stop)
        session.advance(session.cfg.steps)
        return session.finish()

    def start(
        self,
        steps: int | None = None,
        *,
        callbacks: Sequence[Any] = (),
        stop: Any = None,
    ) -> FitSession:
        """Begin a fit without running a step: ``session.advance(n)`` runs, ``finish()`` ends.

        Sets up the scaler, probes and the live ``session.result``, and calls ``on_fit_start``.
        """
        cfg = self.train if steps is None else dataclasses.replace(self.train, steps=steps)
        return FitSession(self, cfg, _callback_list(callbacks), _stop_flag(stop))

    # ------------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Plain state for a checkpoint (scaler state: the last fit's scaler, or a pending one)."""
        scaler_state = self._pending_scaler
        if self.amp is not None and self.amp.scaler is not None:
            scaler_state = self.amp.state_dict()
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": scaler_state,
            "counters": {
                "steps": self.steps_done,
                "attempts": self.attempts_done,
                "microbatches": self.microbatches_done,
            },
            "rng": ckpt.rng_state(),
            "plan": self.plan.to_dict(),
        }

    def save_checkpoint(self, path: Any) -> Any:
        """Write model, optimizer, scaler, counters, RNG and plan to ``path``."""
        return ckpt.save_checkpoint(path, self.state_dict())

    def load_checkpoint(self, path: Any) -> None:
        """Restore a checkpoint; the grad scaler state is restored into the next fit's scaler.

        Every entry is checked first (``ValueError`` naming each bad one); with any bad entry
        nothing is changed.
        """
        payload = ckpt.load_checkpoint(path, map_location=self.device)
        ckpt.validate_state(payload, self.model, self.optimizer, f"checkpoint {str(path)!r}")
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        counters = payload["counters"]
        self.steps_done = counters["steps"]
        self.attempts_done = counters["attempts"]
        self.microbatches_done = counters["microbatches"]
        ckpt.restore_rng(payload["rng"])
        self._pending_scaler = payload["scaler"] or None
        if payload["plan"] != self.plan.to_dict():
            self._pending_events.append(
                Event(
                    "checkpoint",
                    f"checkpoint was written under plan {payload['plan'].get('mode')!r}; "
                    f"continuing under plan {self.plan.mode!r}",
                )
            )


def fit(
    model: nn.Module | Workload | str,
    batches: Any = None,
    *,
    preset: str = "tiny",
    device: Any = "auto",
    precision: PrecisionConfig | str | None = None,
    optimizer: OptimizerConfig | None = None,
    train: TrainConfig | None = None,
    loss_fn: Callable[..., torch.Tensor] | str | None = None,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    distributed: Distributed | None = None,
    **train_options: Any,
) -> RunResult | DistributedResult:
    """Train once and return the :class:`RunResult`.

    ``model``: an ``nn.Module`` (with ``batches``), a :class:`Workload`, or a built-in workload
    name (with ``preset``). Extra keyword arguments are :class:`TrainConfig` fields
    (``fit("mlp", steps=50, accumulation=2)``).

    ``distributed``: a :class:`~precision_nb.core.distributed.Distributed` request trains on
    several processes started by torchrun and returns a ``DistributedResult``: the arguments go to
    :func:`~precision_nb.engine.distributed.launcher.fit_distributed` as they are (``factory=``
    too; the model and ``loss_fn`` then reach the workers by import path).
    """
    if distributed is not None:
        from precision_nb.engine.distributed.launcher import fit_distributed  # imports this module

        return fit_distributed(
            model, batches, distributed=distributed, preset=preset, device=device,
            precision=precision, optimizer=optimizer, train=train, loss_fn=loss_fn,
            callbacks=callbacks, stop=stop, **train_options,
        )  # fmt: skip
    cfg = make_train_config(train, train_options)
    model, batches, info = prepare(model, batches, preset, device, cfg.seed)
    trainer = Trainer(
        model,
        batches,
        device=device,
        precision=precision,
        optimizer=optimizer,
        train=cfg,
        loss_fn=loss_fn,
        workload_info=info,
    )
    return trainer.fit(callbacks=_callback_list(callbacks), stop=stop)


def _callback_list(callbacks: Any) -> list[Any]:
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
        raise ValueError(
            f"callbacks: invalid value {short_repr(callbacks)} ({type(callbacks).__name__}); "
            "allowed: a list of objects with on_fit_start / on_log / on_fit_end methods"
        )
    return list(callbacks)


def _stop_flag(stop: Any) -> Any:
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise ValueError(
            f"stop: invalid value {short_repr(stop)} ({type(stop).__name__}); "
            "allowed: None or a threading.Event (anything with is_set())"
        )
    return stop


def make_train_config(train: TrainConfig | None, options: dict[str, Any]) -> TrainConfig:
    """``train`` (or the defaults) with ``options`` applied; unknown names list the fields."""
    cfg = train if train is not None else TrainConfig()
    if not isinstance(cfg, TrainConfig):
        raise ValueError(
            f"train: invalid value {short_repr(train)} ({type(train).__name__}); "
            "allowed: a TrainConfig or None"
        )
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    unknown = [short_repr(k) for k in options if k not in names]
    if unknown:
        raise ValueError(
            f"unknown train option(s) {', '.join(unknown[:5])}; TrainConfig fields: "
            + ", ".join(names)
        )
    return dataclasses.replace(cfg, **options) if options else cfg


def prepare(
    model: nn.Module | Workload | str | None,
    batches: Any,
    preset: str,
    device: Any,
    seed: int | None,
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """Model, batches and workload info from a module (+ batches) or a workload / its name.

    A workload's model is built right after ``seed_everything(seed)`` and its batches are
    placed on the device the trainer will resolve.
    """
    if resolve_device(device).type == "meta":  # torch would fail deep inside the first step
        raise ValueError(
            "device: 'meta' holds shapes without data, so nothing can train or be measured on "
            "it; allowed: 'auto', 'cpu', 'cuda', 'cuda:N', 'mps' or another device with data"
        )
    info: dict[str, Any] = {}
    if isinstance(model, str):
        model = get_workload(model, preset)
    if isinstance(model, Workload):
        seed_everything(seed or 0)
        info = dict(model.info)
        if batches is None:
            batches = model.make_batches(resolve_device(device))
        model = model.make_model()
    if batches is None:
        raise ValueError("batches is None; pass batches for your own model (or a workload name)")
    return model, batches, info
