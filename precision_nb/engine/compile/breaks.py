"""Graph breaks with their reasons: where TorchDynamo stops capturing a model, and why.

:func:`graph_breaks` asks ``torch._dynamo.explain`` about the region the engine compiles (the
model's forward, under the plan's autocast entered outside it), then runs the precision probes:

- **autocast inside** (mixed plans): the same forward with ``torch.autocast`` entered inside the
  compiled function, to show whether moving autocast into the graph changes the breaks;
- **GradScaler inside** (plans with a scaler): a whole training step (forward, loss,
  ``scaler.scale(loss).backward()``, ``scaler.step``, ``scaler.update``) as one compiled function,
  the way a user compiling their step would write it: the breaks the scaler causes.

``explain`` reports a break only when the graph before it held an op; a break at the very start
of a frame is counted by dynamo in ``counters["graph_break"]`` instead, with its reason but no
frame. Both are read, so no break goes unlisted. ``explain`` runs the function for real (on deep
copies here) and calls ``torch._dynamo.reset()`` before and after, which drops every compiled
graph of the process: call :func:`graph_breaks` before compiling the plans that are measured.
A model whose forward dynamo captures no op of is *untraceable*: compiling it only adds overhead;
:attr:`BreakReport.message` names the first reason.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from precision_nb.core.amp import autocast_context, make_grad_scaler
from precision_nb.core.plan import PrecisionPlan
from precision_nb.engine.batches import output_to_loss, split_batch
from precision_nb.engine.quiet import profiler_ranges_unsaid

__all__ = ["BreakReport", "GraphBreak", "GraphBreaks", "PrecisionProbe", "graph_breaks"]

#: Names of ops that draw random numbers (any name with "dropout" counts too).
_RANDOM = frozenset(
    {
        "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm",
        "bernoulli", "bernoulli_", "normal", "normal_", "uniform_", "multinomial", "rrelu",
        "poisson", "exponential_", "geometric_", "cauchy_", "log_normal_",
    }
)  # fmt: skip
#: Words in a break's reason or frames that tie it to a precision component.
_CAUSES = (("scaler", ("gradscaler", "grad_scaler")), ("autocast", ("autocast", "autocast_mode")))


@dataclass(frozen=True)
class GraphBreak:
    """One break: torch's reason (first line), the rest of its text, where, and what caused it.

    ``where``: "file.py:14 in forward" (the user frame dynamo stopped at), "" when torch recorded
    no frame. ``cause``: "scaler", "autocast" or "model".
    """

    reason: str
    detail: str = ""
    where: str = ""
    cause: str = "model"

    def text(self) -> str:
        at = f" at {self.where}" if self.where else ""
        return f"{self.reason}{at} [{self.cause}]"


@dataclass(frozen=True)
class BreakReport:
    """What ``torch._dynamo.explain`` saw of one region.

    ``graphs``: graphs captured; ``ops``: ops in them; ``breaks``: every break with its reason.
    ``error``: explain itself failed (the region raised); the message is kept.
    ``random_ops``: the captured ops that draw random numbers (dropout, ``rand``...; why they
    matter: :meth:`~precision_nb.engine.compile.agreement.Agreement.message`).
    """

    region: str
    graphs: int = 0
    ops: int = 0
    breaks: tuple[GraphBreak, ...] = ()
    error: str | None = None
    random_ops: tuple[str, ...] = ()

    @property
    def traceable(self) -> bool:
        """True when dynamo captured at least one op (and explain ran)."""
        return self.error is None and self.ops > 0

    def message(self) -> str:
        """One sentence that stays true whatever the counts are."""
        if self.error is not None:
            return f"{self.region}: torch._dynamo.explain failed: {self.error}"
        if not self.traceable:
            first = self.breaks[0].text() if self.breaks else "torch recorded no reason"
            return (
                f"{self.region}: dynamo cannot trace it at all (no op captured); first break: "
                f"{first}. Compiling it would only add overhead: the plan runs eager"
            )
        graphs = f"{self.graphs} graph{'s' if self.graphs != 1 else ''}"
        if not self.breaks:
            return f"{self.region}: no graph break; {self.ops} op(s) captured in {graphs}"
        return (
            f"{self.region}: {len(self.breaks)} graph break(s); {self.ops} op(s) in {graphs}; "
            f"first: {self.breaks[0].text()}"
        )


@dataclass(frozen=True)
class PrecisionProbe:
    """A precision component moved inside the compiled region, and what that does to breaks."""

    name: str
    report: BreakReport
    finding: str


@dataclass(frozen=True)
class GraphBreaks:
    """The compiled region's breaks and the precision probes of one plan."""

    plan: str
    forward: BreakReport
    probes: tuple[PrecisionProbe, ...] = ()

    def rows(self) -> list[dict[str, Any]]:
        """One row per break (region, reason, where, cause), for tables and CSVs."""
        return [
            dict(plan=self.plan, region=r.region, reason=b.reason, where=b.where, cause=b.cause)
            for r in (self.forward, *(p.report for p in self.probes))
            for b in r.breaks
        ]

    def lines(self) -> list[str]:
        return [self.forward.message(), *(f"{p.name}: {p.finding}" for p in self.probes)]


def _break_counts() -> dict[str, int]:
    counters = importlib.import_module("torch._dynamo.utils").counters
    return dict(counters["graph_break"])


def _cause(*texts: str) -> str:
    low = " ".join(texts).lower()
    return next((cause for cause, words in _CAUSES if any(w in low for w in words)), "model")


def _split(reason: str) -> tuple[str, str]:
    lines = [line.rstrip() for line in str(reason).strip().splitlines()]
    return (lines[0] if lines else ""), "\n".join(lines[1:]).strip()


def _frame(stack: Any) -> tuple[str, str]:
    frames = list(stack or [])
    if not frames:
        return "", ""
    last = frames[-1]
    name = str(last.filename).rsplit("/", 1)[-1]
    files = " ".join(str(f.filename) for f in frames)
    return f"{name}:{last.lineno} in {last.name}", files


def explain(region: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BreakReport:
    """``torch._dynamo.explain(fn)(*args, **kwargs)`` as a :class:`BreakReport` (resets dynamo);
    dynamo's line that it leaves the optimizer step's profiler range out is not printed."""
    before = _break_counts()
    try:
        with profiler_ranges_unsaid():
            out = importlib.import_module("torch._dynamo").explain(fn)(*args, **kwargs)
    except (RuntimeError, ValueError, TypeError, AttributeError, AssertionError) as exc:
        return BreakReport(region, error=f"{type(exc).__name__}: {exc}")
    breaks: list[GraphBreak] = []
    for item in out.break_reasons:
        reason, detail = _split(item.reason)
        where, files = _frame(item.user_stack)
        if any(b.reason == reason and b.where == where for b in breaks):
            continue  # the same site seen again from an enclosing frame
        breaks.append(GraphBreak(reason, detail, where, _cause(item.reason, files)))
    for text, count in _break_counts().items():
        if count <= before.get(text, 0):
            continue
        reason, detail = _split(text)
        if all(b.reason != reason for b in breaks):  # a break before any op: no frame recorded
            breaks.append(GraphBreak(reason, detail, "", _cause(text)))
    names = [getattr(op, "__name__", str(op)) for ops in out.ops_per_graph for op in ops]
    random = tuple(dict.fromkeys(n for n in names if n in _RANDOM or "dropout" in n.lower()))
    return BreakReport(
        region, int(out.graph_count), int(out.op_count), tuple(breaks), random_ops=random
    )


_WHAT = {"autocast": "autocast", "scaler": "the GradScaler"}


def _probe(
    name: str, region: str, fn: Callable[..., Any], cause: str, outside: BreakReport, batch: tuple
) -> PrecisionProbe:
    """Explain ``fn`` on ``batch`` (args, kwargs) -- a precision component moved inside the
    compiled region -- and say what the component changes against ``outside`` (the region the
    engine compiles)."""
    report = explain(region, fn, *batch[0], **batch[1])
    caused = [b for b in report.breaks if b.cause == cause]
    what = _WHAT[cause]
    engine = f"with it outside, as the engine runs it: {len(outside.breaks)} break(s)"
    if report.error is not None:
        finding = report.message()
    elif caused:
        finding = (
            f"{what} inside the compiled region breaks the graph {len(caused)} time(s); first: "
            f"{caused[0].text()}; {engine}"
        )
    else:
        finding = (
            f"no break caused by {what} in torch {torch.__version__}: {len(report.breaks)} "
            f"break(s) with it inside the compiled region, {engine}"
        )
    return PrecisionProbe(name, report, finding)


def _autocast_inside(model: nn.Module, plan: PrecisionPlan) -> Callable[..., Any]:
    def forward_with_autocast_inside(*a: Any, **k: Any) -> Any:
        with autocast_context(plan):
            return model(*a, **k)

    return forward_with_autocast_inside


def _whole_step(
    model: nn.Module, plan: PrecisionPlan, labels: Any, loss_fn: Callable[..., Any] | None
) -> Callable[..., torch.Tensor]:
    scaler = make_grad_scaler(plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def whole_step(*a: Any, **k: Any) -> torch.Tensor:
        with autocast_context(plan):
            loss, _ = output_to_loss(model(*a, **k), labels, loss_fn)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return whole_step


def graph_breaks(
    model: nn.Module,
    batch: Any,
    plan: PrecisionPlan,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    label: str | None = None,
    probes: bool = True,
) -> GraphBreaks:
    """The graph breaks of ``model`` on ``batch`` (already on the model's device) under ``plan``.

    Deep copies of ``model`` run; the model itself is left untouched. ``probes=False`` skips the
    autocast and scaler probes (the forward is always explained). Resets dynamo (see module doc).
    """
    args, kwargs, labels = split_batch(batch, model, loss_fn)
    args, kwargs = tuple(args), dict(kwargs)
    work = copy.deepcopy(model).train()
    where = f"{type(model).__name__}.forward"
    region = f"{where} under {plan.mode} autocast" if plan.autocast_enabled else where
    with autocast_context(plan):
        forward = explain(region, work, *args, **kwargs)
    found: list[PrecisionProbe] = []
    if probes and forward.traceable and plan.autocast_enabled:
        inside = _autocast_inside(copy.deepcopy(model).train(), plan)
        region = f"{where} with {plan.mode} autocast inside the compiled function"
        name = "autocast inside the compiled region"
        found.append(_probe(name, region, inside, "autocast", forward, (args, kwargs)))
    if probes and forward.traceable and plan.use_scaler:
        step = _whole_step(copy.deepcopy(model).train(), plan, labels, loss_fn)
        region = "a whole training step with its GradScaler, compiled"
        name = "GradScaler inside the compiled step"
        found.append(_probe(name, region, step, "scaler", forward, (args, kwargs)))
    return GraphBreaks(label or plan.mode, forward, tuple(found))
