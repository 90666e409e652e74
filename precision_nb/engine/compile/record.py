"""Compile a model for a plan, and record what compiling cost, apart from the steady state.

:func:`compile_model` applies a resolved :class:`~precision_nb.core.compile_mode.CompilePlan` to a
module (``torch.compile(model, mode=...)``): the compiled wrapper shares the module's parameters,
so the module itself is what a checkpoint saves (its keys carry no ``_orig_mod.`` prefix).

A :class:`CompileLog` follows one trainer's compiled model:

- :meth:`CompileLog.compile_step` runs the **compile step**: one forward and backward on a
  throw-away copy of the model, before the first training step (the trainer does this in
  ``start()``, with the RNG state forked so the step takes nothing from training's RNG stream).
  Dynamo keeps the compiled code per code object and guards, so the real model's first step
  reuses it: the compile never lands in a training step's time. The record keeps the step's wall
  time and what torch compiled in it: seconds by its own accounting, forward and backward graphs,
  and whether the local caches (inductor's FX-graph cache, AOTAutograd's cache) answered — a
  cache hit makes the compile shorter and is said, never hidden;
- :meth:`CompileLog.add` keeps **recompilations**: compilations during training, each with the
  guard that failed (``recompile_reason``) and where it happened; those steps carry their cost;
- **CUDA-graph skips** (``reduce-overhead`` and ``max-autotune`` off CUDA) are counted.

Several plans compiled in one process share dynamo's code cache: a plan compiled second compiles
its own graphs (the autocast state is part of dynamo's guards), which torch records as a
recompilation of the same code. Those compile-step compilations are this plan's compile, not a
recompilation: only compilations during training are counted as recompilations.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from precision_nb.core.compile_mode import CompilePlan
from precision_nb.engine.compile.torch_state import TorchCompilations, TorchWatch

log = logging.getLogger(__name__)

__all__ = ["CompileLog", "CompileRecord", "compile_model", "reset_compiled"]


def compile_model(model: nn.Module, plan: CompilePlan) -> nn.Module:
    """``torch.compile(model, **plan.torch_kwargs())``; ``model`` itself for an "off" plan.

    Compilation is lazy: it happens at the first call, which a :class:`CompileLog` records.
    """
    if not plan.enabled:
        return model
    return torch.compile(model, **plan.torch_kwargs())


def reset_compiled() -> None:
    """Drop every graph dynamo compiled in this process (``torch._dynamo.reset()``): the next
    compiled call compiles again (the on-disk caches may still answer, and are reported)."""
    importlib.import_module("torch._dynamo").reset()


@dataclass(frozen=True)
class CompileRecord:
    """What compiling one plan cost and did, apart from its steady-state step times.

    ``compile_s``: wall time of the compile step (the compile plus one forward and backward on a
    throw-away copy; None before it ran). ``first``: torch's compilations in it. ``later``:
    ``(where, compilations)`` for compilations during training (recompilations), ``where``
    naming the steps ("measured steps 5-8"). ``failure``: the error that ended the compile.
    """

    label: str
    mode: str
    device_type: str = "cpu"
    compile_s: float | None = None
    first: TorchCompilations = field(default_factory=TorchCompilations)
    later: tuple[tuple[str, TorchCompilations], ...] = ()
    failure: str | None = None

    @property
    def torch_compile_s(self) -> float:
        """Seconds torch's own accounting gives the compile step's compilations."""
        return self.first.seconds

    @property
    def recompiles(self) -> tuple[tuple[str, str], ...]:
        """``(where, reason)`` of each recompilation during training."""
        out = []
        for where, seen in self.later:
            for entry in seen.entries:
                if entry.kind == "forward":
                    out.append((where, entry.recompile_reason or "a new frame was compiled"))
        return tuple(out)

    @property
    def recompile_s(self) -> float:
        return sum(seen.seconds for _, seen in self.later)

    @property
    def cache(self) -> str:
        """The compile step's cache outcome: "hit", "miss", "partial" or "none"."""
        return self.first.cache

    @property
    def cudagraph_skips(self) -> tuple[str, ...]:
        """Inductor's reasons for skipping CUDA graphs (logged on CUDA devices only)."""
        watched = (self.first, *(seen for _, seen in self.later))
        return tuple(dict.fromkeys(skip for w in watched for skip in w.cudagraph_skips))

    @property
    def cudagraph_skip_count(self) -> int:
        """Graphs compiled without the CUDA graphs the mode asked for (inductor's counter)."""
        return self.first.cudagraph_skip_count + sum(s.cudagraph_skip_count for _, s in self.later)

    def cache_text(self) -> str:
        return {
            "hit": "cache hit: inductor's and AOTAutograd's local caches answered every lookup, "
            "so this compile is shorter than a cold one",
            "partial": "partly cached: some graphs came from the local caches, others were "
            "compiled",
            "miss": "cold compile: no local cache entry answered",
            "none": "no cache lookup recorded",
        }[self.cache]

    def graphs_text(self) -> str:
        """The graphs torch's accounting lists for the compile step. A backward graph that
        AOTAutograd's cache answered has no entry of its own: then the text says the backward
        graphs came from the cache (or that none was recorded), never "0 backward graphs"."""
        forward = sum(1 for e in self.first.entries if e.kind == "forward")
        backward = sum(1 for e in self.first.entries if e.kind == "backward")
        if backward:
            return f"{forward} forward and {backward} backward graph(s)"
        if self.cache in ("hit", "partial"):
            return (
                f"{forward} forward graph(s), their backward graphs reused from the local "
                "caches (not listed apart)"
            )
        return f"{forward} forward graph(s); no backward graph recorded"

    def lines(self) -> list[str]:
        """What the report says about this plan's compile, one sentence per line."""
        if self.failure is not None:
            return [f"{self.label}: compile failed: {self.failure}"]
        out: list[str] = []
        if self.compile_s is not None:
            out.append(
                f"{self.label}: compile step {self.compile_s:.2f} s (the compile plus one forward "
                f"and backward on a throw-away copy, before training; torch's own accounting: "
                f"{self.torch_compile_s:.2f} s for {self.graphs_text()}); {self.cache_text()}; "
                "not in any step time"
            )
        recompiles = self.recompiles
        if recompiles:
            shown = "; ".join(f"{where}: {why}" for where, why in recompiles[:3])
            more = f"; and {len(recompiles) - 3} more" if len(recompiles) > 3 else ""
            out.append(
                f"{self.label}: {len(recompiles)} recompilation(s) during training, "
                f"{self.recompile_s:.2f} s, inside those steps' times ({shown}{more})"
            )
        else:
            out.append(f"{self.label}: no recompilation during training")
        out += [f"{self.label}: CUDA graphs not used: {skip}" for skip in self.cudagraph_skips]
        if self.cudagraph_skip_count and not self.cudagraph_skips:
            out.append(
                f"{self.label}: CUDA graphs not used: inductor skipped them for "
                f"{self.cudagraph_skip_count} graph(s) (its cudagraph_skips counter); they record "
                f"CUDA kernels only and this plan runs on {self.device_type}"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "mode": self.mode,
            "device_type": self.device_type,
            "compile_s": self.compile_s,
            "torch_compile_s": self.torch_compile_s,
            "cache": self.cache,
            "recompiles": [list(r) for r in self.recompiles],
            "recompile_s": self.recompile_s,
            "cudagraph_skips": list(self.cudagraph_skips),
            "cudagraph_skip_count": self.cudagraph_skip_count,
            "failure": self.failure,
        }

    def merged(self, later: CompileRecord, where: str) -> CompileRecord:
        """This record (the one that compiled) with ``later``'s compilations appended as
        recompilations, each ``where`` prefixed (a measured session after a warm-up)."""
        extra = list(later.later)
        if later.first.entries or later.first.cudagraph_skip_count:
            extra.insert(0, ("compile step", later.first))
        added = tuple((f"{where} {w}", seen) for w, seen in extra)
        return replace(self, later=self.later + added, failure=self.failure or later.failure)


class CompileLog:
    """What torch compiled for one trainer's model: the compile step, then recompilations."""

    def __init__(self, label: str, plan: CompilePlan) -> None:
        self.label = label
        self.plan = plan
        self.compile_s: float | None = None
        self.first: TorchCompilations | None = None
        self.later: list[tuple[str, TorchCompilations]] = []
        self.failure: str | None = None

    @property
    def compiled(self) -> bool:
        """True once the compile step ran (later fits of the same trainer skip it)."""
        return self.first is not None

    def compile_step(self, step: Callable[[], Any]) -> None:
        """Run ``step`` (a forward and backward on a copy) as the compile step, timed and
        watched; an error is recorded (``failure``) and raised as it is."""
        watch = TorchWatch()
        start = time.perf_counter()
        try:
            with watch:
                step()
        except (RuntimeError, ValueError, TypeError, AssertionError) as exc:
            self.first = watch.result
            self.failure = f"{type(exc).__name__}: {exc}"
            log.warning("%s: compile failed: %s", self.label, self.failure)
            raise
        self.compile_s = time.perf_counter() - start
        self.first = watch.result

    def add(self, where: str, seen: TorchCompilations) -> None:
        """Keep what torch compiled during training steps (``where``: "steps 5-8")."""
        if seen.entries or seen.cudagraph_skips or seen.cudagraph_skip_count:
            self.later.append((where, seen))

    def record(self) -> CompileRecord:
        """The :class:`CompileRecord` so far."""
        return CompileRecord(
            label=self.label,
            mode=self.plan.mode,
            device_type=self.plan.device_type,
            compile_s=self.compile_s,
            first=self.first if self.first is not None else TorchCompilations(),
            later=tuple(self.later),
            failure=self.failure,
        )
