"""One fit as a resumable session: ``Trainer.start()`` -> ``advance(n)`` ... -> ``finish()``.

``Trainer.fit()`` is ``start()`` + ``advance(all)`` + ``finish()``, so a run's losses, scales and
parameters are the same however its steps are split into ``advance`` calls. The loop
(:meth:`FitSession._chunk` and :meth:`FitSession._attempt`) runs optimizer attempts in chunks that
end at logging points (or at the end of an ``advance``), each with one host transfer
(:class:`Recorder`).

The session owns what belongs to one fit (its ``RunResult``, the record fields, the events handed
to it, the recorder, the timer, the callbacks) and reads the trainer's long-lived state (model,
optimizer, precision); the only trainer state it changes is the :class:`Counters` it is given.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from precision_nb.core import validate
from precision_nb.core.events import Event
from precision_nb.engine.batches import (
    BatchesExhausted,
    batch_shape,
    output_to_loss,
    split_batch,
    to_device,
)
from precision_nb.engine.callbacks import Callbacks, ProgressBar
from precision_nb.engine.compile.record import compile_model
from precision_nb.engine.compile.torch_state import TorchWatch
from precision_nb.engine.compile.visibility import mark_compiled
from precision_nb.engine.inspect.step import run_inspection
from precision_nb.engine.memory_probe import MemoryProbe
from precision_nb.engine.numerics.scale_window import cast_limits
from precision_nb.engine.numerics.training import grad_underflow_stats
from precision_nb.engine.recorder import Chunk, Recorder, RunContext, StepTimer
from precision_nb.engine.results import DeviceOutOfMemoryError, FitError, RunResult, attach_result
from precision_nb.engine.run_setup import (
    check_loss,
    describe_run,
    fallback_events,
    seed_everything,
    verify_event,
)
from precision_nb.engine.train_config import CountedLR, TrainConfig

if TYPE_CHECKING:
    from precision_nb.engine.trainer import Trainer

log = logging.getLogger(__name__)

#: The plan's fields every record carries.
_PLAN_FIELDS = ("mode", "weights", "remedy", "dtype", "use_scaler", "autocast_enabled")


@dataclass
class Counters:
    """A trainer's counters (checkpointed): counted optimizer steps, attempts (steps + skipped),
    microbatches. The session of a fit advances them."""

    steps: int = 0
    attempts: int = 0
    microbatches: int = 0


class FitSession:
    """A started fit, made by :meth:`Trainer.start` (``events``: this fit's so far)."""

    def __init__(
        self,
        trainer: Trainer,
        cfg: TrainConfig,
        callbacks: Callbacks | Sequence[Any],
        stop: Any,
        events: Sequence[Event] = (),
    ) -> None:
        self.trainer, self.cfg, self.stop = trainer, cfg, stop
        self.precision = trainer.precision
        self.counters = trainer.counters
        self.result = RunResult(
            label=cfg.label or trainer.label,
            plan=trainer.plan,
            explanation=trainer.explanation,
            optimizer_outcome=trainer.optimizer_outcome,
            device=str(trainer.device),
            events=list(events),
        )
        self.progress = ProgressBar(cfg.steps, self.counters.steps) if cfg.progress else None
        callbacks = Callbacks(callbacks)
        self.callbacks = callbacks.plus(self.progress) if self.progress else callbacks
        self.counted = 0
        self.stop_reason: str | None = None
        self._last_task: str | None = None
        self._closed = False
        self._loss_checked = False
        with self._guard():
            self._setup()

    # ------------------------------------------------------------------------ public API

    @property
    def done(self) -> bool:
        """True once no more steps will run: all counted, stopped, failed or finished."""
        return self._closed or self.stop_reason is not None or self.counted >= self.cfg.steps

    def advance(self, n: int) -> int:
        """Run up to ``n`` more counted steps; returns how many were counted in this call."""
        n = validate.integer("advance.n", n, 0)
        target, before = min(self.cfg.steps, self.counted + n), self.counted
        every = self.cfg.log_every
        with self._guard(), self._watch_compiles(before):
            while not self.done and self.counted < target:
                self._chunk(min(target - self.counted, every - self.counted % every))
        return self.counted - before

    def finish(self) -> RunResult:
        """Final bookkeeping (stop event, seconds, final loss), ``on_fit_end``; the RunResult."""
        if self._closed:
            return self.result
        result, cfg = self.result, self.cfg
        self._close()
        if self.stop_reason is None and self.counted < cfg.steps:
            self.stop_reason = "finished before all steps ran"
        if self.stop_reason is not None:
            result.stopped = True
            msg = f"{self.stop_reason} after {self.counted} of {cfg.steps} steps"
            data = {"reason": self.stop_reason, "steps": self.counted, "of": cfg.steps}
            result.events.append(Event("stop", msg, data))
        result.seconds = time.perf_counter() - self.rec.t_start
        if self.trainer.explanation.compile.enabled:
            result.compile = record = self.trainer.compile_log.record()
            data = {"run": result.label, **record.to_dict()}
            result.events += [Event("compile", line, data) for line in record.lines()[1:]]
        finite = [r["loss"] for r in result.records if math.isfinite(r["loss"])]
        result.final_loss = finite[-1] if finite else None
        with self._guard():  # an on_fit_end callback's error carries the result too
            self.callbacks.fit_end(result)
        return result

    # ------------------------------------------------------------------------ setup

    def _setup(self) -> None:
        t, cfg, result = self.trainer, self.cfg, self.result
        if cfg.seed is not None and not (self.counters.steps or self.counters.attempts):
            seed_everything(cfg.seed)
        result.events.extend(fallback_events(t.explanation, t.optimizer_outcome))
        result.events.append(verify_event(t.plan, t.device))
        # the first microbatch, peeked: measured for shape and FLOPs, then trained on
        index = self.counters.microbatches
        first = to_device(t.source.get(index), t.device)
        self._peeked: tuple[int, Any] | None = (index, first)
        self.samples = batch_shape(first, None).samples
        if cfg.inspect:  # before the peak window opens: its memory is not the run's
            result.inspection = self._inspect(first)
        self._compile(first)  # before the peak window and the first step: no step pays it
        self.probe = MemoryProbe(t.device)
        self.probe.reset()
        run = describe_run(
            t.model, t.device, t.plan, cfg, t.workload_info, first, self._loss_and_task
        )
        result.workload = run.workload
        result.events.extend(run.events)
        self.callbacks.fit_start(result)
        named = [(n, p) for n, p in t.model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        # the precision's overflow injection, looked up once: only the lab asks for it
        self.inject = self.precision.inject_overflow if cfg.overflow_at_steps else None
        self.stats_every = cfg.grad_stats_every
        if self.stats_every:
            cast_limits("fp16")  # found by casting (a host read): once here, cached for the loop
        self.lr = CountedLR(t.optimizer, cfg, self.counters.steps)
        self.sync_mode = cfg.cuda_sync_debug if t.device.type == "cuda" else None
        self.timer = StepTimer(t.device)
        context = RunContext(
            base=self._record_base(result.label),
            shape=run.shape,
            flops_per_step=run.flops_per_step,
            peak=run.peak,
            accumulation=cfg.accumulation,
            where=f"plan {t.plan.mode} on {t.device}",
            precision=self.precision,
            param_names=tuple(n for n, _ in named),
        )
        self.rec = Recorder(
            context, result, self.probe, self.timer, self.callbacks, self.counters.steps
        )

    def _record_base(self, label: str) -> dict[str, Any]:
        """The record fields that stay the same for the whole fit."""
        t, plan = self.trainer, self.trainer.plan.to_dict()
        return {
            "run": label,
            **{key: plan[key] for key in _PLAN_FIELDS},
            "device_type": plan["device_type"],
            "device": str(t.device),
            "fused_adamw": bool(getattr(t.optimizer_outcome, "used", False)),
            "loss_scale_lab": self.precision.lab,
        }

    def _inspect(self, first: Any) -> Any:
        """One instrumented step on a copy of the model, on the first microbatch of this fit
        (the model, optimizer and RNG stream are untouched, so training is the same)."""
        t = self.trainer
        try:
            data = run_inspection(
                t.model, [first], t.plan, loss_fn=t.loss_fn, device=t.device,
                optimizer=t.optimizer_config,
            )  # fmt: skip
            if t.explanation.compile.enabled:  # the eager step, said so first
                mark_compiled(data, t.explanation.compile, t.label)
            return data
        except DeviceOutOfMemoryError as exc:
            probe = MemoryProbe(t.device)
            data = {"peak_bytes": probe.read().peak, "memory_kind": probe.kind}
            self.result.events.append(Event("oom", str(exc), dict(data, phase="inspection")))
            raise DeviceOutOfMemoryError(str(exc), self.result) from exc

    def loss(self, batch: Any, forward: Any = None) -> torch.Tensor:
        """The model's loss on one microbatch under the plan's forward context. ``forward``: what
        to call instead of the trainer's forward (the compile step's copy)."""
        t = self.trainer
        args, kwargs, labels = split_batch(batch, t.model, t.loss_fn)
        with self.precision.forward_context():
            out = (t.forward if forward is None else forward)(*args, **kwargs)
            loss, task = output_to_loss(out, labels, t.loss_fn)
        self._last_task = task
        if not self._loss_checked:
            check_loss(loss, self.trainer.loss_fn)
            self._loss_checked = True
        return loss

    def _compile(self, batch: Any) -> None:
        """A compiled plan's compile step, once per trainer: one forward and backward on a
        throw-away copy of the model with the RNG state forked, so it takes nothing from
        training's RNG stream, and the real first step reuses the compiled code
        (engine/compile/record.py)."""
        t = self.trainer
        log_ = t.compile_log
        if not t.explanation.compile.enabled or log_.compiled:
            return

        def step() -> None:
            work = copy.deepcopy(t.model)
            self.loss(batch, compile_model(work, t.explanation.compile)).backward()

        try:
            with torch.random.fork_rng(devices=[t.device] if t.device.type == "cuda" else []):
                log_.compile_step(step)
        finally:
            record = log_.record()
            data = {"run": self.result.label, **record.to_dict()}
            self.result.events.append(Event("compile", record.lines()[0], data))

    @contextlib.contextmanager
    def _watch_compiles(self, before: int) -> Iterator[None]:
        """What torch compiles during these steps of a compiled plan: recompilations."""
        if not self.trainer.explanation.compile.enabled:
            yield
            return
        with TorchWatch() as watch:
            yield
        self.trainer.compile_log.add(f"steps {before + 1}-{self.counted}", watch.result)

    def _loss_and_task(self, batch: Any) -> tuple[torch.Tensor, str | None]:
        """The loss the FLOP count traces: the eager model's (a compiled model does not run
        under the counter's dispatch mode anyway, see engine/compile/visibility.py)."""
        loss = self.loss(batch, self.trainer.model)
        return loss, self._last_task

    # ------------------------------------------------------------------------ the loop

    def _chunk(self, want: int) -> None:
        """Up to ``want`` attempts, one host transfer, a record at a logging point."""
        opt, rec, precision = self.trainer.optimizer, self.rec, self.precision
        chunk = Chunk(first_attempt=self.counters.attempts)
        floor_check = precision.scale_below_floor if precision.scaled else None
        below: float | None = None
        try:
            with self._sync_debug():
                for i in range(want):
                    if self.stop is not None and self.stop.is_set():
                        self.stop_reason = "stopped by request"
                        break
                    # never an attempt at a scale below the floor (at 0 it writes NaN weights)
                    below = floor_check() if floor_check is not None else None
                    if below is not None:
                        break
                    self._attempt(chunk, last=i == want - 1)
        except KeyboardInterrupt:
            self.stop_reason = "interrupted (KeyboardInterrupt)"
            opt.zero_grad(set_to_none=True)
        except BatchesExhausted:
            self.stop_reason = "batch source ran out"
        except Exception:
            try:  # keep the finished attempts of this interval, then re-raise
                self._flush(chunk)
                rec.emit(time.perf_counter())
            except Exception:
                log.exception("could not record the steps made before the failure")
            raise
        good = self._flush(chunk)  # stops the run if the chunk's last attempt left the floor
        if below is not None:  # the scale was below the floor before this chunk's first attempt
            rec.below_floor(self.counters.attempts + 1, below, before=True)
        self.counted += good
        if self.counted % self.cfg.log_every == 0 or self.done:
            rec.emit(time.perf_counter())
            # only here, so the LR does not depend on how a run is split into advance() calls
            self.lr.sync(rec.steps_done)

    def _attempt(self, chunk: Chunk, last: bool) -> None:
        """One optimizer attempt: K microbatches, one precision step, zero_grad."""
        t, amp, K, lr = self.trainer, self.precision, self.cfg.accumulation, self.lr
        counters = self.counters
        if lr.active:  # a constant LR without warmup needs no per-step work
            lr.before_attempt()
        self.timer.start()
        total = None
        for _ in range(K):
            loss = self.loss(self._next_batch())
            counters.microbatches += 1
            total = loss.detach() if total is None else total + loss.detach()
            amp.backward(loss / K if K > 1 else loss)
        counters.attempts += 1
        if self.inject is not None:  # teaching: the lab's overflow_at_steps
            self.inject(counters.attempts, self.params)
        # the counted step this attempt makes unless skipped (skips are known at the next flush)
        if self.stats_every and (self.counted + len(chunk.losses) + 1) % self.stats_every == 0:
            chunk.add_stats(self._grad_stats())
        out = amp.step(t.optimizer, self.cfg.grad_clip, self.params, total)
        t.optimizer.zero_grad(set_to_none=True)
        if lr.active:
            lr.after_attempt(out.stepped)
        self.timer.stop(last)
        chunk.add(total, out)  # type: ignore[arg-type]

    def _grad_stats(self) -> dict[str, torch.Tensor]:
        """fp16 underflow of the gradients as they are now: scaled by the loss scale (they are
        read before the step unscales them), or unscaled without a scaler. Device tensors only."""
        # FSDP2 gradients are DTensors: count this rank's shard
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in self.params]
        return grad_underflow_stats(grads, None, "fp16")

    def _next_batch(self) -> Any:
        index = self.counters.microbatches
        if self._peeked is not None and self._peeked[0] == index:
            batch, self._peeked = self._peeked[1], None
            return batch
        return to_device(self.trainer.source.get(index), self.trainer.device)

    def _flush(self, chunk: Chunk) -> int:
        chunk.final_scale = self.precision.scale_tensor() if chunk.losses else None
        try:
            return self.rec.flush(chunk, float(self.trainer.optimizer.param_groups[0]["lr"]))
        finally:
            self.counters.steps = self.rec.steps_done

    # ------------------------------------------------------------------------ plumbing

    @contextlib.contextmanager
    def _sync_debug(self) -> Iterator[None]:
        """CUDA sync checks on for the attempts, off for logging (``train.cuda_sync_debug``)."""
        if not self.sync_mode:
            yield
            return
        old = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(self.sync_mode)
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(old)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Every failure carries the result and closes the session: out of memory becomes a
        ``DeviceOutOfMemoryError``; a ``FitError`` has it already; anything else (your model's,
        batches', loss's or callback's error, torch's, Ctrl-C before the first step) is
        re-raised as itself with the result attached (:func:`attach_result`)."""
        try:
            yield
        except BaseException as exc:
            self._close()
            if isinstance(exc, torch.OutOfMemoryError):
                raise self._oom(exc) from exc
            if not isinstance(exc, FitError):
                attach_result(exc, self.result)
            raise

    def _close(self) -> None:
        self._closed = True
        if self.progress is not None:
            self.progress.close()

    def _oom(self, exc: BaseException) -> FitError:
        t, cfg = self.trainer, self.cfg
        probe = MemoryProbe(t.device)
        peak = probe.read().peak
        t.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if t.device.type == "cuda":
            torch.cuda.empty_cache()
        samples = getattr(self, "samples", None) or t.workload_info.get("batch_size", "?")
        msg = (
            f"out of memory on {t.device} with plan {t.plan.mode} "
            f"(dtype {t.plan.dtype}, scaler {t.plan.use_scaler}), batch size {samples} "
            f"x {cfg.accumulation} microbatches, peak {peak / 2**20:.0f} MiB ({probe.kind}); "
            "memory was released. Use a smaller preset or batch, more accumulation, or a "
            "mixed-precision plan."
        )
        self.result.events.append(
            Event("oom", msg, {"peak_bytes": peak, "memory_kind": probe.kind})
        )
        return DeviceOutOfMemoryError(msg, self.result)
