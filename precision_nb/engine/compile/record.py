"""Compile a model for a plan, and record what compiling cost, apart from the steady state.

:func:`compile_model` applies a resolved :class:`~precision_nb.core.compile_mode.CompilePlan` to a
module (``torch.compile(model, mode=...)``): the compiled wrapper shares the module's parameters,
so the module itself is what a checkpoint saves (its keys carry no ``_orig_mod.`` prefix).

A :class:`CompileLog` follows one compiled plan: every session of that plan (the warm-up's
throw-away one and the measured one) is wrapped by :meth:`CompileLog.watch`, so each ``advance``
runs inside a :class:`~precision_nb.engine.compile.torch_state.TorchWatch` and what torch compiled
is kept with the step it happened at. :meth:`CompileLog.record` turns that into a
:class:`CompileRecord`:

- the **first step** (the compile and one step; it is a warm-up step, never a measured one) and
  what torch compiled in it: seconds by its own accounting, forward and backward graphs, whether
  the local caches (inductor's FX-graph cache, AOTAutograd's cache) answered — a cache hit makes
  the first step cheaper and is said, never hidden;
- **recompilations**: compilations after the first step, each with the guard that failed
  (``recompile_reason``); the steps they happened in carry their cost;
- **CUDA-graph skips** with inductor's reason (``reduce-overhead`` and ``max-autotune`` off CUDA).

Several plans compiled in one process share dynamo's code cache: a plan compiled second compiles
its own graphs (the autocast state is part of dynamo's guards), which torch records as a
recompilation of the same code. Those first-step compilations are this plan's compile, not a
recompilation: only compilations after a plan's first step are counted as recompilations.
"""

from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from precision_nb.core.compile_mode import CompilePlan
from precision_nb.engine.compile.torch_state import TorchCompilations, TorchWatch

log = logging.getLogger(__name__)

__all__ = [
    "CompileLog",
    "CompileRecord",
    "WatchedSession",
    "compile_model",
    "reset_compiled",
]


def compile_model(model: nn.Module, plan: CompilePlan) -> nn.Module:
    """``torch.compile(model, **plan.torch_kwargs())``; ``model`` itself for an "off" plan.

    Compilation is lazy: it happens at the first call, which a :class:`CompileLog` records.
    """
    if not plan.enabled:
        return model
    import torch

    return torch.compile(model, **plan.torch_kwargs())


def reset_compiled() -> None:
    """Drop every graph dynamo compiled in this process (``torch._dynamo.reset()``): the next
    compiled call compiles again (the on-disk caches may still answer, and are reported)."""
    importlib.import_module("torch._dynamo").reset()


@dataclass(frozen=True)
class CompileRecord:
    """What compiling one plan cost and did, apart from its steady-state step times.

    ``first_step_s``: wall time of the plan's first step (compile + step). ``steady_step_s``: its
    steady-state median step time (None until measured). ``first``: torch's compilations in the
    first step. ``later``: ``(step, compilations)`` for compilations after it (recompilations).
    ``failure``: the error that ended the compile, as shown to the user.
    """

    label: str
    mode: str
    device_type: str = "cpu"
    first_step_s: float | None = None
    steady_step_s: float | None = None
    first: TorchCompilations = field(default_factory=TorchCompilations)
    later: tuple[tuple[str, TorchCompilations], ...] = ()
    failure: str | None = None

    @property
    def compile_s(self) -> float | None:
        """The first step's wall time minus a steady step: what compiling added to it."""
        if self.first_step_s is None:
            return None
        steady = self.steady_step_s
        if steady is None or not math.isfinite(steady):
            return self.first_step_s
        return max(0.0, self.first_step_s - steady)

    @property
    def torch_compile_s(self) -> float:
        """Seconds torch's own accounting gives the first step's compilations."""
        return self.first.seconds

    @property
    def recompiles(self) -> tuple[tuple[str, str], ...]:
        """``(where, reason)`` of each recompilation after the first step."""
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
        """The first step's cache outcome: "hit", "miss", "partial" or "none"."""
        return self.first.cache

    @property
    def cudagraph_skips(self) -> tuple[str, ...]:
        """Inductor's reasons for skipping CUDA graphs (logged on CUDA devices only)."""
        skips = list(self.first.cudagraph_skips)
        for _, seen in self.later:
            skips += list(seen.cudagraph_skips)
        return tuple(dict.fromkeys(skips))

    @property
    def cudagraph_skip_count(self) -> int:
        """Graphs compiled without the CUDA graphs the mode asked for (inductor's counter)."""
        return self.first.cudagraph_skip_count + sum(s.cudagraph_skip_count for _, s in self.later)

    def cache_text(self) -> str:
        return {
            "hit": "cache hit: inductor's and AOTAutograd's local caches answered every lookup, "
            "so this compile time is shorter than a cold compile",
            "partial": "partly cached: some graphs came from the local caches, others were "
            "compiled",
            "miss": "cold compile: no local cache entry answered",
            "none": "no cache lookup recorded",
        }[self.cache]

    def lines(self) -> list[str]:
        """What the report says about this plan's compile, one sentence per line."""
        if self.failure is not None:
            return [f"{self.label}: compile failed: {self.failure}"]
        out: list[str] = []
        if self.first_step_s is not None:
            forward = sum(1 for e in self.first.entries if e.kind == "forward")
            backward = sum(1 for e in self.first.entries if e.kind == "backward")
            compile_s = self.compile_s or 0.0
            out.append(
                f"{self.label}: first step {self.first_step_s:.2f} s, of which about "
                f"{compile_s:.2f} s compiling (first step minus a steady step; torch's own "
                f"accounting: {self.torch_compile_s:.2f} s for {forward} forward and {backward} "
                f"backward graph(s)); {self.cache_text()}; a warm-up step, not in the step times"
            )
        recompiles = self.recompiles
        if recompiles:
            shown = "; ".join(f"{where}: {why}" for where, why in recompiles[:3])
            more = f"; and {len(recompiles) - 3} more" if len(recompiles) > 3 else ""
            out.append(
                f"{self.label}: {len(recompiles)} recompilation(s) after the first step, "
                f"{self.recompile_s:.2f} s ({shown}{more})"
            )
        else:
            out.append(f"{self.label}: no recompilation after the first step")
        for skip in self.cudagraph_skips:
            out.append(f"{self.label}: CUDA graphs not used: {skip}")
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
            "first_step_s": self.first_step_s,
            "steady_step_s": self.steady_step_s,
            "compile_s": self.compile_s,
            "torch_compile_s": self.torch_compile_s,
            "cache": self.cache,
            "recompiles": [list(r) for r in self.recompiles],
            "recompile_s": self.recompile_s,
            "cudagraph_skips": list(self.cudagraph_skips),
            "cudagraph_skip_count": self.cudagraph_skip_count,
            "failure": self.failure,
        }


class WatchedSession:
    """A session whose every ``advance`` runs inside a :class:`TorchWatch` (see
    :class:`CompileLog`); everything else is the wrapped session's."""

    def __init__(self, session: Any, log_: CompileLog, phase: str) -> None:
        self._session = session
        self._log = log_
        self._phase = phase
        self._steps = 0

    def advance(self, n: int) -> int:
        before = self._steps
        watch = TorchWatch()
        try:
            with watch:
                got = self._session.advance(n)
        except (RuntimeError, ValueError) as exc:  # recorded, then raised as it is
            self._log.add(self._phase, before, watch.result, failure=exc)
            raise
        self._steps += got
        self._log.add(self._phase, before, watch.result, times=self._times(got))
        return got

    def _times(self, got: int) -> list[float]:
        result = getattr(self._session, "result", None)
        times = list(getattr(result, "step_times_s", []) or [])
        return [float(t) for t in times[-got:]] if got and times else []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class CompileLog:
    """What torch compiled for one plan, step by step, across the plan's sessions.

    The first ``advance`` of the first session watched holds the plan's first step (with a
    warm-up, the throw-away warm-up session's); everything compiled after it is a recompilation.
    """

    def __init__(self, label: str, plan: CompilePlan) -> None:
        self.label = label
        self.plan = plan
        self.first_step_s: float | None = None
        self.first: TorchCompilations | None = None
        self.later: list[tuple[str, TorchCompilations]] = []
        self.failure: str | None = None

    def watch(self, session: Any, phase: str = "warm-up") -> WatchedSession:
        """``session`` with its ``advance`` calls watched by this log; ``phase`` names it in
        the record ("warm-up", "measured")."""
        return WatchedSession(session, self, phase)

    def add(
        self,
        phase: str,
        before: int,
        seen: TorchCompilations,
        times: list[float] | None = None,
        failure: BaseException | None = None,
    ) -> None:
        """Keep what one ``advance`` compiled: the first step's compile, or a recompilation."""
        if failure is not None:
            self.failure = f"{type(failure).__name__}: {failure}"
            log.warning("%s: compile or step failed: %s", self.label, self.failure)
        if self.first is None:
            self.first = seen
            if times:
                self.first_step_s = times[0]
        elif seen.entries or seen.cudagraph_skips or seen.cudagraph_skip_count:
            self.later.append((f"{phase} step {before + 1}", seen))

    def record(self, steady_step_s: float | None = None) -> CompileRecord:
        """The :class:`CompileRecord` so far (``steady_step_s``: the measured median step)."""
        return CompileRecord(
            label=self.label,
            mode=self.plan.mode,
            device_type=self.plan.device_type,
            first_step_s=self.first_step_s,
            steady_step_s=steady_step_s,
            first=self.first if self.first is not None else TorchCompilations(),
            later=tuple(self.later),
            failure=self.failure,
        )
