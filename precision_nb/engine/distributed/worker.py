"""The module ``torchrun`` runs on every rank (``-m precision_nb.engine.distributed.worker SPEC``).

Each rank builds the model (a built-in workload by name and preset, or a ``module:factory``
import path with an optional saved state dict), trains its slice of every global batch with the
engine's :class:`~precision_nb.engine.trainer.Trainer` on the model wrapped in DDP or sharded by
FSDP2, and appends what it records to ``rank<R>.jsonl`` in the run folder, one JSON line each:
``start`` (with the rank's node and host), ``fit_start``, every ``record`` as it is logged (with
the collective bytes since the previous one), then ``result`` or ``error``. After joining the
process group every rank checks that the nodes started what the run file describes
(:func:`~precision_nb.engine.distributed.rank.init_rank`). The launcher reads those lines, live
and at the end, so a rank that dies keeps every line it wrote.

A spec with ``plans`` (a distributed profile) runs every plan in this one launch and measures
them together: :mod:`precision_nb.engine.distributed.rank_measure`; its lines carry a ``plan``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import torch.distributed as dist

from precision_nb.engine.distributed.counting import CommCounter, counting_group
from precision_nb.engine.distributed.nodes import node_identity
from precision_nb.engine.distributed.parallel import wrap_model
from precision_nb.engine.distributed.rank import (
    CommObserver,
    RankLog,
    RankProbes,
    build_model,
    init_rank,
    make_trainer,
    train_config,
)
from precision_nb.engine.distributed.rank_measure import run_measured
from precision_nb.engine.results import partial_result

__all__ = ["main", "run"]


def run(spec: dict[str, Any], log: RankLog) -> None:
    if spec.get("plans"):
        run_measured(spec, log, STOP)
        return
    rank, world, device = init_rank(spec)
    plan = spec["plan"]
    counter = CommCounter() if plan["count_collectives"] else None
    group = counting_group(counter) if counter is not None else dist.group.WORLD
    train = train_config(spec)
    model, batches, info = build_model(spec, device, train.seed)
    info = dict(info, rank=rank, nproc=world)
    wrapped = wrap_model(model, plan, group, device)
    trainer = make_trainer(wrapped, batches, device, spec, train=train, workload_info=info)
    probes = RankProbes(wrapped, trainer)
    try:
        result = trainer.fit(callbacks=[CommObserver(log, counter)])
    finally:
        probes.write(log)
    log.write("result", result=result.to_dict())
    dist.destroy_process_group()


#: Set when torchrun asks this rank to stop (SIGTERM): a measured run stops between steps.
STOP = threading.Event()


def _terminate(signum: int, _frame: Any) -> None:
    # torchrun sends SIGTERM when another rank failed or the caller stopped the run: stop
    # between steps like Ctrl-C does (the trainer keeps every record made so far).
    STOP.set()
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    rank = int(os.environ["RANK"])
    log = RankLog(Path(spec["run_dir"]) / f"rank{rank}.jsonl")
    log.write("start", pid=os.getpid(), rank=rank, argv=args, node=node_identity())
    signal.signal(signal.SIGTERM, _terminate)
    try:
        run(spec, log)
    except BaseException as exc:  # noqa: BLE001 - recorded for the launcher, then exit code 1
        partial = partial_result(exc)  # the rank's own error, with what it recorded
        log.write(
            "error",
            type=type(exc).__name__,
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
            result=partial.to_dict() if hasattr(partial, "to_dict") else None,
        )
        return 1
    finally:
        log.close()
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The rank's log is closed and its process group destroyed: leave without the interpreter's
    # teardown, where torch's C++ destructors can abort on a race between their threads
    # ("terminate called without an active exception", seen on a loaded machine), which would
    # turn a finished rank into a failed run.
    os._exit(status)
