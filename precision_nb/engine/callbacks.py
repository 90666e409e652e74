"""Run callbacks: the :class:`Callback` base, the one dispatcher, and the progress bar.

Subclass :class:`Callback` and override the hooks you need; the others do nothing. A plain object
with only some of the ``on_...`` methods works too: :class:`Callbacks` (the dispatcher every run
uses) looks each hook up once when a run starts, so an absent method costs nothing per call.
:class:`ProgressBar` is the progress shown by ``TrainConfig(progress=True)``: a callback like any
other, drawn by ``tqdm.auto`` (a notebook widget in Jupyter, a text bar in a console).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from precision_nb.core.validate import short_repr

if TYPE_CHECKING:
    from precision_nb.engine.results import RunResult

#: Every hook a run calls, in the order a run calls them.
HOOKS = ("on_fit_start", "on_warmup", "on_phase", "on_log", "on_fit_end")


class Callback:
    """Hooks a run calls; each does nothing here. Override the ones you need."""

    def on_fit_start(self, result: RunResult) -> None:
        """A fit set up (the live ``RunResult``, with its workload and events so far)."""

    def on_warmup(self, label: str, warmup: Any) -> None:
        """A compared plan's warm-up started (``warmup`` None) or ended (its ``Warmup``)."""

    def on_phase(self, text: str) -> None:
        """A measured distributed run entered a phase ("warm-up of bf16", "round 3/8")."""

    def on_log(self, record: dict[str, Any]) -> None:
        """One record was written (a logging point)."""

    def on_fit_end(self, result: Any) -> None:
        """The fit finished or stopped (the final ``RunResult`` or ``DistributedResult``)."""


def _dispatch(hook: str) -> Callable[..., None]:
    """The :class:`Callbacks` method that calls ``hook`` on every callback that has it."""

    def call(self: Callbacks, *args: Any) -> None:
        for fn in self._hooks[hook]:
            fn(*args)

    return call


class Callbacks:
    """The one dispatcher: calls a hook on every callback that has it, in the given order."""

    def __init__(self, callbacks: Iterable[Any] = ()) -> None:
        if isinstance(callbacks, Callbacks):
            callbacks = callbacks.items
        if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
            raise ValueError(
                f"callbacks: invalid value {short_repr(callbacks)} ({type(callbacks).__name__}); "
                "allowed: a list of Callback objects (or objects with some of the methods "
                + ", ".join(HOOKS)
                + ")"
            )
        self.items: tuple[Any, ...] = tuple(callbacks)
        self._hooks: dict[str, tuple[Callable[..., Any], ...]] = {
            name: tuple(
                hook for hook in (getattr(cb, name, None) for cb in self.items) if callable(hook)
            )
            for name in HOOKS
        }

    def __len__(self) -> int:
        return len(self.items)

    def plus(self, *more: Any) -> Callbacks:
        """These callbacks followed by ``more``."""
        return Callbacks((*self.items, *more))

    def wants(self, hook: str) -> bool:
        """Whether any callback has ``hook`` (so a caller can skip the work of making its data)."""
        return bool(self._hooks[hook])

    fit_start = _dispatch("on_fit_start")
    warmup = _dispatch("on_warmup")
    phase = _dispatch("on_phase")
    log = _dispatch("on_log")
    fit_end = _dispatch("on_fit_end")


class ProgressBar(Callback):
    """A fit's progress in counted steps, advanced at logging points. ``steps_done``: the
    trainer's counted steps before the fit."""

    def __init__(self, total: int, steps_done: int = 0) -> None:
        self.total, self.start = total, steps_done
        self.bar: Any = None

    def on_fit_start(self, result: RunResult) -> None:
        self.bar = tqdm(total=self.total, desc=result.label, unit="step", leave=False)

    def on_log(self, record: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.update(int(record["step"]) - self.start - self.bar.n)

    def on_fit_end(self, result: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the bar (also when the run failed: ``on_fit_end`` is not called then)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
