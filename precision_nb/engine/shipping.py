"""Send this process's model, batches and loss to fresh measuring processes, or say why not.

A model defined in a notebook cell has its class in ``__main__``, which a fresh interpreter
does not have: ``pickle`` stores classes by reference and could not load it there.
:func:`pack` writes the objects with ``torch.save`` using ``cloudpickle`` as its pickler:
``cloudpickle`` serialises classes and functions of ``__main__`` (and lambdas, closures) by value,
as Dask, Ray and joblib do, while ``torch.save`` keeps every tensor's storage in the file as raw
bytes instead of inside the pickle stream. :func:`unpack` is the worker's side.

Not everything can travel: a lock, an open file, a parametrized module (torch refuses to pickle
one: "Serialization of parametrized modules is only supported through state_dict()"). Then
:class:`CannotShip` carries the reason, which the measurement records and the verdict shows
("measured here: ..."). The file is written and read on this machine by this package only; it is
loaded with ``weights_only=False`` because it holds code (classes, functions) by design.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SHIPPABLE", "CannotShip", "Shipped", "pack", "unpack"]

#: What may travel, in the order the worker reads it: the initial model, its batches, its loss.
SHIPPABLE = ("model", "batches", "loss_fn")


class CannotShip(RuntimeError):
    """The objects cannot be sent to a fresh process; ``str()`` says which and why."""


@dataclasses.dataclass(frozen=True)
class Shipped:
    """What :func:`pack` wrote: one file per object in ``folder``, their size and write time."""

    folder: Path
    names: tuple[str, ...]
    bytes: int
    seconds: float

    def describe(self) -> str:
        return (
            f"{', '.join(self.names)} sent to the fresh processes by value "
            f"({self.bytes / 2**20:.1f} MiB, written in {self.seconds:.2f} s)"
        )


def pack(folder: Path, objects: Mapping[str, Any]) -> Shipped:
    """Write ``objects`` (keys from :data:`SHIPPABLE`) into ``folder`` for :func:`unpack`, one
    file each; :class:`CannotShip` names the object that cannot travel and the pickler's reason."""
    import cloudpickle
    import torch

    unknown = sorted(set(objects) - set(SHIPPABLE))
    if unknown:
        raise ValueError(f"objects: {unknown} cannot be shipped; allowed: {', '.join(SHIPPABLE)}")
    start = time.perf_counter()
    size, names = 0, tuple(n for n in SHIPPABLE if n in objects)
    for name in names:
        path = Path(folder) / f"{name}.pt"
        try:
            torch.save(objects[name], path, pickle_module=cloudpickle)
        # Pickling runs the objects' own __reduce__/__getstate__: any exception there means
        # "cannot travel", and its text is the reason the verdict shows.
        except Exception as exc:  # noqa: BLE001 - recorded as the reason, never hidden
            path.unlink(missing_ok=True)
            raise CannotShip(
                f"the {name} cannot be pickled for a fresh process ({_one_line(exc)})"
            ) from exc
        size += path.stat().st_size
    return Shipped(Path(folder), names, size, time.perf_counter() - start)


def unpack(folder: str | Path, names: Sequence[str]) -> dict[str, Any]:
    """The objects :func:`pack` wrote into ``folder`` (a fresh process's side)."""
    import torch

    # our own files, written for this run: they hold classes and functions by design
    return {name: torch.load(Path(folder) / f"{name}.pt", weights_only=False) for name in names}


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or "no message"
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}"
