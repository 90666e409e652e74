"""A counting layer for collectives: a ``ProcessGroup`` that records bytes by op and dtype, then
forwards every call to the real group (gloo or nccl).

It is registered as a torch.distributed backend plugin (``dist.Backend.register_backend``) and
created with ``dist.new_group``, so DDP (whose C++ reducer calls the group through torch's Python
``ProcessGroup`` trampoline), FSDP2 and plain ``dist.*`` calls all go through it. Bytes follow the
convention of NCCL's tests: the size of the full buffer a collective works on (the reduced tensor
for all-reduce, the gathered output for all-gather, the unsharded input for reduce-scatter).

Time in flight: each collective's seconds from the call to the completion of its work (the host
clock at the call, and when the work's future completes), summed by op and dtype. Collectives run
asynchronously and overlap compute (DDP's bucketed all-reduces during backward, FSDP2's
prefetched all-gathers), so this is how long communication was under way, not time it added to
the step. A work whose completion cannot be observed (no future) is counted as untimed, never
guessed.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
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
    """Bytes, calls and seconds in flight by (op, dtype) since the last :meth:`take`."""

    def __init__(self) -> None:
        self._totals = self._empty()
        self._lock = threading.Lock()  # completions arrive on the backend's threads

    @staticmethod
    def _empty() -> defaultdict[tuple[str, torch.dtype], list[float]]:
        return defaultdict(lambda: [0, 0, 0.0, 0])  # bytes, tensors, seconds, timed tensors

    def add(self, op: str, tensors: Iterable[torch.Tensor]) -> dict[tuple[str, torch.dtype], int]:
        """Count the buffer; returns how many of its tensors fell under each (op, dtype)."""
        keys: dict[tuple[str, torch.dtype], int] = {}
        with self._lock:
            for t in tensors:
                key = (op, t.dtype)
                slot = self._totals[key]
                slot[0] += t.numel() * t.element_size()
                slot[1] += 1
                keys[key] = keys.get(key, 0) + 1
        return keys

    def track(self, keys: dict[tuple[str, torch.dtype], int], work: Any, t0: float) -> None:
        """Add the seconds from ``t0`` until ``work`` completes, when its future allows it (a call
        over several dtypes splits its seconds by tensor count)."""
        if not keys or work is None:
            return
        try:
            future = work.get_future()
        except (RuntimeError, AttributeError):  # counted as untimed: no completion to observe
            return
        total = sum(keys.values())

        def done(_: Any) -> None:
            elapsed = time.perf_counter() - t0
            with self._lock:
                for key, n in keys.items():
                    slot = self._totals[key]
                    slot[2] += elapsed * n / total
                    slot[3] += n

        future.add_done_callback(done)

    def take(self) -> list[dict[str, Any]]:
        """Rows ``{op, dtype, bytes, calls, seconds, timed_calls}`` counted so far; the counts
        start again at zero. ``calls`` counts tensors (a coalesced call counts each of its
        tensors); ``seconds`` sums the time in flight of the ``timed_calls``."""
        with self._lock:
            totals, self._totals = self._totals, self._empty()
        return [
            {
                "op": op,
                "dtype": dtype_name(dt),
                "bytes": int(b),
                "calls": int(c),
                "seconds": s,
                "timed_calls": int(n),
            }
            for (op, dt), (b, c, s, n) in sorted(totals.items(), key=lambda kv: kv[0][0])
        ]


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
        keys = self.counter.add(op, pick(*args))
        t0 = time.perf_counter()
        work = getattr(self.inner, name)(*args)
        self.counter.track(keys, work, t0)
        return work

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


for _name, (_op, _pick) in _METHODS.items():
    setattr(CountingGroup, _name, _forwarder(_name, _op, _pick))
for _name in ("barrier", "_start_coalescing", "_end_coalescing"):  # forwarded, not counted
    setattr(CountingGroup, _name, lambda self, *args, _n=_name: getattr(self.inner, _n)(*args))


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
