"""The public ``fit()``: a run request in, a trained result out (here or on torchrun's workers).

``fit`` turns its arguments into one :class:`~precision_nb.engine.request.RunRequest`, builds the
model and batches it names, and trains them with a
:class:`~precision_nb.engine.trainer.Trainer`. With ``distributed=Distributed(...)`` the same
request goes to :func:`~precision_nb.engine.distributed.launcher.launch` instead (loaded then: a
single-process run never imports the distributed machinery).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.callbacks import Callbacks
from precision_nb.engine.request import RunRequest
from precision_nb.engine.results import RunResult
from precision_nb.engine.train_config import TrainConfig
from precision_nb.engine.trainer import Trainer
from precision_nb.engine.workloads import Workload

if TYPE_CHECKING:
    from precision_nb.core.distributed import Distributed
    from precision_nb.engine.distributed.results import DistributedResult

__all__ = ["fit", "run"]


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
    compile: Any = "off",
    **train_options: Any,
) -> RunResult | DistributedResult:
    """Train once and return the :class:`RunResult`.

    ``model``: an ``nn.Module`` (with ``batches``), a :class:`Workload`, or a built-in workload
    name (with ``preset``). Extra keyword arguments are :class:`TrainConfig` fields
    (``fit("mlp", steps=50, accumulation=2)``).

    ``distributed``: a :class:`~precision_nb.core.distributed.Distributed` request trains on
    several processes started by torchrun and returns a ``DistributedResult``, as
    :func:`~precision_nb.engine.distributed.launcher.fit_distributed` does with the same
    arguments (``factory=`` too; the model and ``loss_fn`` then reach the workers by import path).

    ``compile``: "off" (eager), "default", "reduce-overhead" or "max-autotune": the model is
    trained through ``torch.compile``; the compile step runs before the first training step and
    is recorded apart (``result.compile``). Distributed runs train eagerly (``compile="off"``).

    ``update_stats``: fit() measures the updates a run's weights rounded away only when asked
    (``update_stats=True``), as it inspects only when asked: the probe copies the weights before
    each logged step and reads them twice after it, a cost in the fit's own time. The surfaces
    that show the figure (compare, profile, the panel) measure it for true plans by default.
    """
    factory = train_options.pop("factory", None) if distributed is not None else None
    request = RunRequest.of(
        model, batches, preset=preset, device=device, precision=precision,
        optimizer=optimizer, train=train, loss_fn=loss_fn, compile=compile, **train_options,
    )  # fmt: skip
    if distributed is not None and request.compile != "off":
        raise ValueError(
            f"compile: invalid value {request.compile!r} with distributed=...; allowed: 'off' "
            "(distributed runs train eagerly: their ranks do not compile the model)"
        )
    if distributed is not None:
        from precision_nb.engine.distributed.launcher import launch

        return launch(request, distributed, factory=factory, callbacks=callbacks, stop=stop)
    if request.train.update_stats is None:  # only when asked here; see the docstring
        request = request.replace(train=dataclasses.replace(request.train, update_stats=False))
    return run(request, callbacks=callbacks, stop=stop)


def run(request: RunRequest, *, callbacks: Iterable[Any] = (), stop: Any = None) -> RunResult:
    """Train ``request`` once in this process (what ``fit`` does without ``distributed``)."""
    dispatch = Callbacks(callbacks)
    model, batches, info = request.prepare()
    return Trainer(
        model,
        batches,
        device=request.device,
        precision=request.precision,
        optimizer=request.optimizer,
        train=request.train,
        loss_fn=request.loss_fn,  # type: ignore[arg-type]
        workload_info=info,
        compile=request.compile,
    ).fit(callbacks=dispatch, stop=stop)
