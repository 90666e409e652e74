"""A rank's side of a measured distributed run (a distributed profile): every plan in one launch.

Every rank builds the model once and keeps its initial weights; each plan then gets its own
wrapped copy (DDP with its comm hook, or FSDP2 with its ``MixedPrecisionPolicy``), its own
counting group (so the bytes per step stay per plan), the same global batches in the same order,
and a :class:`~precision_nb.engine.trainer.Trainer` session. The plans are measured by
:func:`precision_nb.engine.measure.measure_plans`, as in one process: a warm-up on throw-away
wrapped copies (over the plain world group, so their collectives are not counted), then rounds of
blocks with the order rotated.

Every rank must issue the same collectives in the same order, so every decision is shared: the
rounds, block sizes and orders are deterministic, and the warm-up's end (local step times, a time
cap) is agreed by :func:`agree_over` (an all-reduce of the "done" flag with MIN: the warm-up ends
when every rank's own rule has ended it). A failing step raises at once (``fail_fast``): the rank
exits, torchrun stops the others and the launcher reports the failing rank.

Lines written (each tagged with ``plan`` where it belongs to one): ``phase`` (warm-up of a plan,
round r of R: the launcher's progress), the usual ``fit_start`` / ``record`` / ``memory`` /
``result`` per plan, then one ``measurement`` line with this rank's warm-ups, block times and round
orders, which the launcher merges over the ranks. With a time split asked for (``time_split`` in
the run file the launcher wrote: a :class:`~precision_nb.engine.time_split.SplitConfig`), every
rank then profiles a few steps of each plan (:func:`split_ranks`) and writes one ``time_split``
line per plan.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from precision_nb.engine.distributed.counting import CommCounter, counting_group
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
from precision_nb.engine.measure import MeasureConfig, WarmupExhausted, measure_plans
from precision_nb.engine.time_split import SplitConfig, missing, profiler_busy, rank_split
from precision_nb.engine.time_split.ranks import ELSEWHERE, to_json

__all__ = ["agree_over", "run_measured", "split_ranks"]


def agree_over(group: Any, device: torch.device) -> Callable[[bool], bool]:
    """``agree(done) -> bool``: True on every rank once every rank passed ``done=True``.

    One all-reduce (MIN) of an int flag over ``group`` (the plain world group: not counted)."""

    def agree(done: bool) -> bool:
        flag = torch.tensor([1 if done else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        return bool(flag.item())

    return agree


class _Plan:
    """One plan's state on this rank: its spec, counter and group, and its measured session."""

    def __init__(self, item: dict[str, Any], count: bool) -> None:
        self.label: str = item["label"]
        self.precision: dict[str, Any] = item["precision"]
        self.spec: dict[str, Any] = item["plan"]
        self.counter = CommCounter() if count else None
        # dist.new_group is collective: the plans' groups are made in the same order everywhere
        self.group = counting_group(self.counter) if self.counter else dist.group.WORLD
        self.probes: Any = None  # a RankProbes once its measured session starts


def run_measured(spec: dict[str, Any], log: RankLog, stop: Any) -> None:
    """Measure every plan of ``spec["plans"]`` on this rank; see the module docstring."""
    rank, world, device = init_rank(spec)
    train = train_config(spec)
    model, batches, info = build_model(spec, device, train.seed)
    info = dict(info, rank=rank, nproc=world)
    initial = copy.deepcopy(model).cpu()
    count = bool(spec["plan"]["count_collectives"])
    plans = {item["label"]: _Plan(item, count) for item in spec["plans"]}
    world_group = dist.group.WORLD
    flag_device = device if spec["plan"]["backend"] == "nccl" else torch.device("cpu")
    mcfg = MeasureConfig(**spec["measure"])
    agree = agree_over(world_group, flag_device)

    def make_session(label: str, steps: int, warmup: bool) -> Any:
        p = plans[label]
        wrapped = wrap_model(
            copy.deepcopy(initial), p.spec, world_group if warmup else p.group, device
        )
        cfg = dataclasses.replace(train, label=label)
        trainer = make_trainer(
            wrapped, batches, device, spec, precision=p.precision, train=cfg, workload_info=info
        )
        if warmup:
            return trainer.start(steps=steps)
        p.probes = RankProbes(wrapped, trainer)
        observer = CommObserver(log, p.counter, label)
        return trainer.start(steps=steps, callbacks=[observer], stop=stop)

    def on_warmup(label: str, warm: Any) -> None:
        if warm is None:
            log.write("phase", plan=label, phase="warm-up", text=f"warm-up of {label}")
        else:
            text = f"warm-up of {label}: {warm.steps} step(s), {warm.rule}"
            log.write("phase", plan=label, phase="warm-up done", text=text)

    def on_round(r: int, rounds: int) -> None:
        log.write("phase", phase="round", round=r, rounds=rounds, text=f"round {r}/{rounds}")

    try:
        measurement, sessions, _ = measure_plans(
            list(plans), make_session, train.steps, mcfg, stop, on_warmup,
            agree=agree, fail_fast=True, on_round=on_round,
        )  # fmt: skip
    except WarmupExhausted:
        if stop.is_set():  # SIGTERM landed in a warm-up step: a stop, not a failure
            raise KeyboardInterrupt("signal SIGTERM") from None
        raise
    for label, session in sessions.items():
        try:
            result = session.finish()
        finally:
            plans[label].probes.write(log, plan=label)
        log.write("result", plan=label, result=result.to_dict())
    _write_measurement(log, mcfg, measurement)
    if spec.get("time_split") is not None:  # after the timed rounds, never inside them
        split_ranks(plans, SplitConfig(**spec["time_split"]), log, agree, stop, measurement)
    dist.destroy_process_group()


def split_ranks(
    plans: dict[str, Any], config: Any, log: RankLog, agree: Any, stop: Any, measurement: Any
) -> None:
    """Profile a few steps of every plan on its own trainer, on every rank, plans in the same
    order (their collectives need all ranks); each plan's split goes to a ``time_split`` line.
    A plan is profiled only when every rank can (an agreement before it); after a rank's
    profiled steps failed, the plans after it are not profiled (the ranks' collectives could no
    longer be in step), and their lines say so."""
    why: str | None = None
    for label, p in plans.items():
        if why is None:
            own = (
                "the run was stopped before its time split" if stop.is_set() or measurement.stopped
                else "another profiler is recording in this process" if profiler_busy()
                else None
            )  # fmt: skip
            if not agree(own is None):
                why = own or ELSEWHERE
        if why is not None:
            log.write("time_split", plan=label, **to_json(missing(label, why)))
            continue
        item = rank_split(p.probes.trainer, label, config)
        log.write("time_split", plan=label, **item)
        if not agree(item["split"]["missing"] is None):
            why = f"the profiled steps of {label} failed on a rank, so later plans are not profiled"


def _write_measurement(log: RankLog, mcfg: MeasureConfig, measurement: Any) -> None:
    log.write(
        "measurement",
        config=dataclasses.asdict(mcfg),
        sizes=measurement.sizes,
        orders=measurement.orders,
        stopped=measurement.stopped,
        plans={
            label: {
                "warmup": dataclasses.asdict(t.warmup) if t.warmup is not None else None,
                "blocks": t.blocks,
                "failed": t.failed,
            }
            for label, t in measurement.plans.items()
        },
    )
