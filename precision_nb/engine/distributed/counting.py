"""A counting layer for collectives: a ``ProcessGroup`` that records bytes by op and dtype, then
forwards every call to the real group (gloo or nccl).

It is registered as a torch.distributed backend plugin (``dist.Backend.register_backend``) and
created with ``dist.new_group``, so DDP (whose C++ reducer calls the group through torch's Python
``ProcessGroup`` trampoline), FSDP2 and plain ``dist.*`` calls all go through it. Bytes follow the
convention of NCCL's tests: the size of the full buffer a collective works on (the reduced tensor
for all-reduce, the gathered output for all-gather, the unsharded input for reduce-scatter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

PLUGIN = "pnb_counting"

#: Short dtype names used in tables ("fp32", "bf16", ...); others keep torch's name.
_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def dtype_name(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype, str(dtype).replace("torch.", ""))


class CommCounter:
    """Bytes and calls by (op, dtype) since the last :meth:`take`."""

    def __init__(self) -> None:
        self._totals: dict[tuple[str, torch.dtype], list[int]] = {}

    def add(self, op: str, tensors: Iterable[torch.Tensor]) -> None:
        totals = self._totals
        for t in tensors:
            key = (op, t.dtype)
            slot = totals.get(key)
            if slot is None:
                slot = totals[key] = [0, 0]
            slot[0] += t.numel() * t.element_size()
            slot[1] += 1

    def take(self) -> list[dict[str, Any]]:
        """Rows ``{op, dtype, bytes, calls}`` counted so far; the counts start again at zero."""
        rows = [
            {"op": op, "dtype": dtype_name(dt), "bytes": b, "calls": c}
            for (op, dt), (b, c) in sorted(self._totals.items(), key=lambda kv: kv[0][0])
        ]
        self._totals = {}
        return rows


def _flat(lists: Iterable[Iterable[torch.Tensor]]) -> list[torch.Tensor]:
    return [t for inner in lists for t in inner]


# method name -> (op name, which tensors make the collective's buffer)
_METHODS: dict[str, tuple[str, Callable[..., Iterable[torch.Tensor]]]] = {
    "allreduce": ("all_reduce", lambda tensors, *_: tensors),
    "allreduce_coalesced": ("all_reduce", lambda tensors, *_: tensors),
    "allgather": ("all_gather", lambda outs, *_: _flat(outs)),
    "allgather_coalesced": ("all_gather", lambda outs, *_: _flat(outs)),
    "all_gather_single": ("all_gather", lambda out, *_: [out]),
    "all_gather_single_coalesced": ("all_gather", lambda outs, *_: outs),
    "reduce_scatter": ("reduce_scatter", lambda _o, ins, *_: _flat(ins)),
    "reduce_scatter_single": ("reduce_scatter", lambda _o, inp, *_: [inp]),
    "reduce_scatter_single_coalesced": ("reduce_scatter", lambda _o, ins, *_: ins),
    "broadcast": ("broadcast", lambda tensors, *_: tensors),
    "reduce": ("reduce", lambda tensors, *_: tensors),
    "gather": ("gather", lambda _o, ins, *_: ins),
    "scatter": ("scatter", lambda outs, *_: outs),
    "all_to_all_single": ("all_to_all", lambda _o, inp, *_: [inp]),
    "alltoall": ("all_to_all", lambda _o, ins, *_: ins),
    "send": ("send", lambda tensors, *_: tensors),
    "recv": ("recv", lambda tensors, *_: tensors),
    "recv_anysource": ("recv", lambda tensors, *_: tensors),
}


def _forwarder(name: str, op: str, pick: Callable[..., Iterable[torch.Tensor]]) -> Callable:
    def method(self: CountingGroup, *args: Any) -> Any:
        self.counter.add(op, pick(*args))
        return getattr(self.inner, name)(*args)

    method.__name__ = name
    method.__doc__ = f"Count the buffer as {op!r}, then call the real group's {name}."
    return method


class CountingGroup(dist.ProcessGroup):
    """Forwards every collective to ``inner`` after adding its buffer to ``counter``."""

    def __init__(self, inner: dist.ProcessGroup, counter: CommCounter) -> None:
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.counter = counter
        self._name = ""

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return PLUGIN

    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def barrier(self, *args: Any) -> Any:
        return self.inner.barrier(*args)

    def _start_coalescing(self, *args: Any) -> Any:
        return self.inner._start_coalescing(*args)

    def _end_coalescing(self, *args: Any) -> Any:
        return self.inner._end_coalescing(*args)


for _name, (_op, _pick) in _METHODS.items():
    setattr(CountingGroup, _name, _forwarder(_name, _op, _pick))


def counting_group(counter: CommCounter) -> CountingGroup:
    """A group over all ranks that counts into ``counter`` and forwards to the default group.

    Call after ``dist.init_process_group``; every rank must call it (it is a ``new_group``).
    """
    world = dist.group.WORLD
    if world is None:
        raise RuntimeError("counting_group: call dist.init_process_group first")
    if not hasattr(dist.Backend, PLUGIN.upper()):
        dist.Backend.register_backend(
            PLUGIN, lambda *_: CountingGroup(_CURRENT[0], _CURRENT[1]), devices=["cpu", "cuda"]
        )
    _CURRENT[:] = [world, counter]
    group = dist.new_group(backend=PLUGIN)
    assert isinstance(group, CountingGroup)
    return group


_CURRENT: list[Any] = [None, None]
