"""The trainer: a model, its optimizer, its precision and its counters, across fits.

The model is moved to the device once and the precision built once for the resolved plan; the
counters are what checkpoints save. Each fit is a :class:`~precision_nb.engine.session.FitSession`.
The public ``fit()`` is in :mod:`precision_nb.engine.entry`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from precision_nb.core.events import Event
from precision_nb.core.names import plan_label
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import explain_precision
from precision_nb.core.validate import short_repr
from precision_nb.engine import checkpoint as ckpt
from precision_nb.engine.batches import BatchSource
from precision_nb.engine.callbacks import Callbacks
from precision_nb.engine.compile.record import CompileLog, compile_model
from precision_nb.engine.precision import Precision, lab_applies
from precision_nb.engine.remedies import build_plan_optimizer, check_installed
from precision_nb.engine.request import optimizer_config, precision_config
from precision_nb.engine.results import RunResult
from precision_nb.engine.session import Counters, FitSession
from precision_nb.engine.train_config import TrainConfig, lr_factor
from precision_nb.engine.true_precision import CastBatches, cast_model
from precision_nb.engine.update_probe import UpdateProbe

__all__ = ["Counters", "FitSession", "TrainConfig", "Trainer", "lr_factor"]

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
        compile: Any = "off",
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
        self.precision_config = precision_config(precision)
        self.optimizer_config = optimizer_config(optimizer)
        self.explanation = explain_precision(
            self.precision_config, device, optimizer=self.optimizer_config, compile=compile
        )
        self.plan = self.explanation.plan
        self.device = torch.device(self.explanation.device)
        #: The one precision of every fit of this trainer (autocast, scaler, floor, label).
        self.precision = Precision.for_plan(
            self.plan, self.device, lab=lab_applies(self.explanation)
        )
        self.model = model
        self.source = batches if isinstance(batches, BatchSource) else BatchSource(batches)
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError(
                f"loss_fn: invalid value {short_repr(loss_fn)} ({type(loss_fn).__name__}); "
                "allowed: None or a callable (output, target) -> scalar loss tensor"
            )
        self.loss_fn = loss_fn
        self.workload_info = dict(workload_info or {})
        check_installed(self.plan)  # a missing remedy library, before the model is touched
        _move_model(model, self.device)
        # a true plan: the model in the plan's dtype (undone if the optimizer cannot be built)
        cast = cast_model(model, self.plan)
        if self.plan.true_weights:
            self.source = CastBatches(self.source, self.plan.dtype)  # type: ignore[assignment]
        #: What the loop calls: the model, or ``torch.compile(model)`` for a compiled plan (the
        #: same parameters; checkpoints save ``model``). Its compile log: the compile step that
        #: ``start()`` runs once on a copy, and recompilations during training.
        self.forward = compile_model(model, self.explanation.compile)
        self.compile_log = CompileLog(self.label, self.explanation.compile)
        try:
            self.optimizer = build_plan_optimizer(
                model, self.optimizer_config, self.device, self.plan
            )
        except BaseException:
            cast.undo()
            raise
        self.optimizer_outcome = getattr(self.optimizer, "precision_nb_fused", None)
        self.counters = Counters()
        # what a loaded checkpoint (or the true plan's cast) tells the next fit
        self._next_fit_events: list[Event] = list(cast.events)
        self._update_probe: UpdateProbe | None = None
        self.last_result: RunResult | None = None

    # ----------------------------------------------------------------------------- helpers

    @property
    def steps_done(self) -> int:
        """Counted optimizer steps so far (every fit and checkpoint included)."""
        return self.counters.steps

    @property
    def attempts_done(self) -> int:
        """Optimizer attempts so far: counted steps plus skipped ones."""
        return self.counters.attempts

    @property
    def microbatches_done(self) -> int:
        return self.counters.microbatches

    @property
    def label(self) -> str:
        """The run label: the precision's, with ``+compile`` for a compiled plan."""
        return self.precision.label + self.explanation.compile.suffix

    @property
    def scaler(self) -> Any:
        """The current fit's grad scaler (None before a fit or without one)."""
        return self.precision.scaler

    def scale_value(self) -> float | None:
        """The grad scaler's current loss scale (a host read; for inspection, not the loop)."""
        return self.precision.scale_value()

    # --------------------------------------------------------------------------- fitting

    def fit(
        self,
        steps: int | None = None,
        *,
        callbacks: Sequence[Any] = (),
        stop: Any = None,
    ) -> RunResult:
        """Run ``steps`` counted optimizer steps (default ``train.steps``); returns a RunResult.

        ``callbacks``: :class:`~precision_nb.engine.callbacks.Callback` objects (or any objects
        with some of ``on_fit_start(result)``, ``on_log(record)``, ``on_fit_end(result)``).
        ``stop``: a ``threading.Event``-like object (``is_set()``) checked between steps; Ctrl-C
        stops the same way. Either way ``result.stopped`` is True and every record made so far
        is kept. Same as ``start()``, ``advance(all)``, ``finish()``.
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

        Resets the precision for a fresh fit (a new grad scaler, checkpointed scaler state
        restored into it), sets up probes and the live ``session.result``, and calls
        ``on_fit_start``.
        """
        cfg = self.train if steps is None else dataclasses.replace(self.train, steps=steps)
        dispatch = Callbacks(callbacks)
        if stop is not None and not callable(getattr(stop, "is_set", None)):
            raise ValueError(
                f"stop: invalid value {short_repr(stop)} ({type(stop).__name__}); "
                "allowed: None or a threading.Event (anything with is_set())"
            )
        events = [*self._next_fit_events, *self.precision.start_fit(cfg, self.counters.attempts)]
        self._next_fit_events = []
        session = FitSession(self, cfg, dispatch, stop, events)
        self.last_result = session.result
        self._probe_updates(session)
        return session

    def _probe_updates(self, session: FitSession) -> None:
        """The fit's update probe (``train.update_stats``; None: on for true plans), its
        measurements kept in ``session.result.update_stats``."""
        if self._update_probe is not None:
            self._update_probe.remove()
            self._update_probe = None
        wanted = session.cfg.update_stats
        if not (self.plan.true_weights if wanted is None else wanted):
            return
        probe = UpdateProbe(
            self.optimizer, session.params, session.rec.context.param_names,
            steps_before=self.counters.steps, steps=session.cfg.steps,
            log_every=session.cfg.log_every,
        )  # fmt: skip
        probe.history = session.result.update_stats
        session.rec.update_probe = probe
        self._update_probe = probe

    # ------------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Plain state for a checkpoint (scaler state: the current fit's scaler, or state loaded
        for the next fit)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.precision.state_dict() or None,
            "counters": dataclasses.asdict(self.counters),
            "rng": ckpt.rng_state(),
            "plan": self.plan.to_dict(),
        }

    def save_checkpoint(self, path: Any) -> Any:
        """Write model, optimizer, scaler, counters, RNG and plan to ``path`` (a true plan's
        tensors in their own dtype, a remedy's optimizer state, Kahan buffers included)."""
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
        for key in ckpt.COUNTERS:
            setattr(self.counters, key, payload["counters"][key])
        ckpt.restore_rng(payload["rng"])
        self.precision.load_state_dict(payload["scaler"])
        old = payload["plan"]
        if old != self.plan.to_dict():
            # a checkpoint from before true plans has only the mode
            label = plan_label(
                str(old.get("mode")), old.get("weights", "mixed"), old.get("remedy", "none")
            )
            self._next_fit_events.append(
                Event(
                    "checkpoint",
                    f"checkpoint was written under plan {label!r}; continuing under plan "
                    f"{self.plan.label!r} (tensors are copied into this plan's dtypes)",
                )
            )
