"""What a fresh measuring process is told: how to rebuild the workload, and what it measures.

:func:`rebuild_spec` turns a comparison's workload into a :class:`WorkerSpec`, whose
:meth:`~WorkerSpec.to_dict` is the run file :mod:`~precision_nb.engine.measure_worker` reads.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from precision_nb.engine.measure import MeasureConfig, PlanSpec

__all__ = ["WorkerSpec", "rebuild_spec"]


@dataclass(frozen=True)
class WorkerSpec:
    """How a fresh process rebuilds the workload and what it measures (all JSON-able).

    ``model``: ``{"workload": name, "preset": preset}``, ``{"factory": "module:function",
    "batches": "module:name", "state_dict": path}`` (the initial weights of this process) or
    ``{"sent": True}``; ``shipped``: objects of this process sent by value (``model``,
    ``batches``, ``loss_fn``; see :mod:`~precision_nb.engine.shipping`).
    """

    model: dict[str, Any]
    device: str
    train: dict[str, Any]
    optimizer: dict[str, Any] | None
    plans: tuple[PlanSpec, ...]
    steps: int
    threads: int
    #: The initial model of this process (a ``module:factory`` model): its weights are sent.
    initial: Any = None
    shipped: Mapping[str, Any] | None = None
    #: The time split each fresh process profiles after its rounds (``SplitConfig`` fields;
    #: None: none), pooled with this process's (:mod:`~precision_nb.engine.time_split.pool`).
    time_split: Mapping[str, Any] | None = None

    def to_dict(self, index: int, measure: MeasureConfig, deadline: float | None) -> dict:
        one = dataclasses.replace(measure, processes=1, budget_s=None)
        return {
            "index": index,
            "model": dict(self.model),
            "device": self.device,
            "train": self.train,
            "optimizer": self.optimizer,
            "plans": [p.to_dict() for p in self.plans],
            "steps": self.steps,
            "threads": self.threads,
            "measure": dataclasses.asdict(one),
            "deadline": deadline,
            "time_split": dict(self.time_split) if self.time_split is not None else None,
            "sys_path": [p for p in sys.path if p],  # a notebook's additions included
        }


def rebuild_spec(
    *,
    workload: Any,
    preset: str,
    user_model: bool,
    batches: Any,
    loss_fn: Any,
    device: Any,
    train: Any,
    optimizer: Any,
    plans: Mapping[str, Any],
    initial: Any,
    model_spec: tuple[str, str] | None = None,
    compiles: Mapping[str, str] | None = None,
) -> tuple[WorkerSpec | None, str]:
    """The :class:`WorkerSpec` of a comparison, or (None, why a fresh process cannot rebuild it).

    A built-in workload is rebuilt by name; a model object from ``model_spec`` (the
    ``module:factory`` and ``module:batches`` it came from; its initial weights are sent along),
    else sent by value with its batches. Batches given with a workload and a ``loss_fn`` are sent
    by value too; whether they can travel is found when they are written (``measure``).
    """
    import torch

    from precision_nb.engine.workloads import WORKLOADS, Workload

    shipped: dict[str, Any] = {} if loss_fn is None else {"loss_fn": loss_fn}
    model: dict[str, Any]
    if model_spec is not None:
        model = {"factory": model_spec[0], "batches": model_spec[1]}
    elif user_model:
        model = {"sent": True}
        shipped.update(model=initial, batches=batches)
    else:
        name = workload.name if isinstance(workload, Workload) else str(workload)
        if name not in WORKLOADS:
            return None, f"workload {name!r} is not built in, so a fresh process cannot build it"
        if batches is not None:
            shipped["batches"] = batches
        preset = workload.preset if isinstance(workload, Workload) else preset
        model = {"workload": name, "preset": preset}
    spec = WorkerSpec(
        model,
        str(device),
        {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(train).items()},
        optimizer.to_dict() if optimizer is not None else None,
        tuple(
            PlanSpec(label, request, (compiles or {}).get(label, "off"))
            for label, request in plans.items()
        ),
        int(train.steps),
        torch.get_num_threads(),
        initial if model_spec is not None else None,
        shipped or None,
    )
    return spec, ""
