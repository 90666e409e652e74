"""A fresh process that measures every plan once, started by the multi-process measurement.

:mod:`precision_nb.engine.measure_processes` runs ``python -m precision_nb.engine.measure_worker
RUN_FILE``. It reads the run file (:meth:`~precision_nb.engine.worker_spec.WorkerSpec.to_dict`),
builds the model from the same seed (or loads the initial weights it was sent), measures the plans
with :func:`~precision_nb.engine.measure.measure_plans`, and writes the step times of every block
to the run file's ``out`` path. At the deadline it stops after the current step and sends what it
has.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

__all__ = ["NotReceived", "build", "main"]


def _import(path: str) -> Any:
    """The object named by ``"package.module:attribute"`` (the current folder importable)."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"import path {path!r}: allowed form 'package.module:name'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def build(spec: dict[str, Any]) -> tuple[Any, Any, dict[str, Any], Any]:
    """The model, its batches, workload info and loss function, as the run file names them.

    ``shipped`` (a folder and names): objects this process's parent sent by value
    (:mod:`~precision_nb.engine.shipping`); they replace what the ``model`` entry would build.
    """
    import torch

    from precision_nb.engine.request import prepare
    from precision_nb.engine.run_setup import seed_everything

    m, seed = spec["model"], spec["train"].get("seed")
    sent = _receive(spec.get("shipped"), spec.get("sys_path", ()))
    if "workload" in m:
        model, batches, info = prepare(
            m["workload"], sent.get("batches"), m["preset"], spec["device"], seed
        )
        return model, batches, info, sent.get("loss_fn")
    seed_everything(seed or 0)
    if "model" in sent:
        return sent["model"], sent["batches"], {}, sent.get("loss_fn")
    model = _import(m["factory"])()
    if m.get("state_dict"):
        state = torch.load(m["state_dict"], map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    batches = _import(m["batches"])
    if callable(batches) and not hasattr(batches, "__iter__"):
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = inspect.signature(batches).parameters.values()
        if not any(p.default is p.empty and p.kind in kinds for p in params):
            batches = batches()  # a factory of the batch source, as the command line treats it
    return model, batches, {}, sent.get("loss_fn")


class NotReceived(RuntimeError):
    """What the parent sent by value did not load here (the parent measures in its own process
    then, and says why)."""


def _receive(shipped: dict[str, Any] | None, sys_path: Any) -> dict[str, Any]:
    """The objects the parent sent (none: {}), loaded with its import path (a notebook's
    ``sys.path`` additions included)."""
    if not shipped:
        return {}
    from precision_nb.engine import shipping

    sys.path.extend(p for p in sys_path if p not in sys.path)
    try:
        return shipping.unpack(shipped["folder"], shipped["names"])
    except Exception as exc:  # noqa: BLE001 - becomes the reason the parent measures alone
        raise NotReceived(f"{type(exc).__name__}: {exc}") from exc


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure the run file's plans in this process; the JSON-able result, with the wall-clock
    time its warm-ups began (its start-up is that less its launch, which the parent knows)."""
    import torch

    from precision_nb.core.optim import OptimizerConfig
    from precision_nb.core.plan import PrecisionConfig
    from precision_nb.engine.measure import MeasureConfig, PlanSpec, measure_plans
    from precision_nb.engine.measure_processes import trainer_sessions
    from precision_nb.engine.train_config import TrainConfig

    torch.set_num_threads(int(spec["threads"]))
    model, batches, info, loss_fn = build(spec)
    train = dataclasses.replace(
        TrainConfig(**spec["train"]), progress=False, measure_peak=False, inspect=False
    )
    plans = {p["label"]: PrecisionConfig(**p["precision"]) for p in spec["plans"]}
    compiles = {p["label"]: p.get("compile", "off") for p in spec["plans"]}
    optimizer = OptimizerConfig(**spec["optimizer"]) if spec.get("optimizer") else None
    trainers: dict[str, Any] = {}
    make_session = trainer_sessions(
        copy.deepcopy(model).cpu(),
        batches,
        device=spec["device"],
        plans=plans,
        optimizer=optimizer,
        train=train,
        loss_fn=loss_fn,
        info=info,
        compiles=compiles,
        trainers=trainers,
    )
    stop = threading.Event()
    if spec.get("deadline") is not None:
        timer = threading.Timer(max(0.0, float(spec["deadline"]) - time.time()), stop.set)
        timer.daemon = True
        timer.start()
    started = time.time()
    measurement, sessions, failures = measure_plans(
        [PlanSpec(label, request, compiles[label]) for label, request in plans.items()],
        make_session,
        int(spec["steps"]),
        MeasureConfig(**spec["measure"]),
        stop,
        offset=int(spec["index"]),
    )
    split = None
    if spec.get("time_split") is not None and not stop.is_set() and not failures:
        split = _time_split(spec, sessions, trainers, measurement)
    return {
        "time_split": split,
        "pid": os.getpid(),
        "started": started,  # wall clock: the parent knows when it launched this process
        "sizes": measurement.sizes,
        "orders": measurement.orders,
        "stopped": measurement.stopped,
        "plans": {label: t.to_dict() for label, t in measurement.plans.items()},
    }


def _time_split(
    spec: dict[str, Any], sessions: dict[str, Any], trainers: dict[str, Any], measurement: Any
) -> dict[str, Any]:
    """Label -> this process's time split of the plan (JSON data), profiled after its rounds as
    the parent profiles its own (:func:`~precision_nb.engine.time_split.split_plans`), with heap
    faulted in ahead as the parent's settled allocator asked (``heap_ahead``). A failure is sent
    as each plan's missing split, saying why: the rounds are sent either way."""
    from precision_nb.engine.time_split import SplitConfig, missing, split_plans
    from precision_nb.engine.time_split.ranks import to_json

    try:
        for session in sessions.values():
            session.finish()
        config = SplitConfig(**spec["time_split"])
        medians = {label: t.spread.median for label, t in measurement.plans.items() if t.times}
        found = split_plans(trainers, medians, config=config)
    except Exception as exc:  # noqa: BLE001 - the parent says why this process's split is missing
        why = f"its time split failed: {type(exc).__name__}: {exc}"
        found = {label: missing(label, why) for label in trainers}
    return {label: to_json(split) for label, split in found.items()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    out = Path(spec["out"])
    try:
        result = run(spec)
        code = 0
    except Exception as exc:  # noqa: BLE001 - sent to the parent, which records it as an event
        result = {
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
            "not_received": isinstance(exc, NotReceived),
        }
        print(result["traceback"], file=sys.stderr)
        code = 1
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    tmp.replace(out)
    return code


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # the result is written and closed: skip torch's slow interpreter teardown
