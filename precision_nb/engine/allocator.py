"""The host memory allocator a measurement runs under: glibc malloc's thresholds, settled.

glibc serves a block above its mmap threshold with a mapping of its own, returned on free, and
gives the top of its heap back above its trim threshold; both start low (128 KiB) and rise when
a process frees a large mapped block (the mmap threshold to that block's size, at most 32 MiB on
64-bit; the trim threshold to twice it). So a process's step time on a CPU depends on what it
freed before: the same bf16 comparison measured here from 1.04x (thresholds kept at 128 KiB) to
1.65x (raised), and fresh processes fell on either side (docs/profiling.md, "What moves a
process's speedup"). A measurement with ``allocator="settled"`` (the default) sets both
thresholds where glibc's own rule takes a long-running training process, in every process that
measures (this one through ``mallopt``, fresh ones through ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` in their environment), so processes measure the same allocator.
``"as-is"`` leaves the allocator as each process finds it. Thresholds the user's environment
sets are kept, and said so; an allocator other than glibc's is left alone, and said so.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from precision_nb.core.defaults import ALLOCATOR_POLICIES as POLICIES

__all__ = ["ENV", "POLICIES", "RESERVE", "describe", "glibc", "reserved", "settle", "worker_env"]

#: glibc's ceiling for its dynamic mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``).
MMAP_THRESHOLD = 32 * 2**20
#: The trim threshold glibc's rule sets beside it (twice the mmap threshold).
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
#: The environment that settles a fresh process from its start (glibc reads it at its first malloc).
ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
#: Bytes of heap :func:`reserved` faults in ahead of profiled steps.
RESERVE = 256 * 2**20


def glibc() -> str | None:
    """The C library's name and version when it is glibc ("glibc 2.36"), else None."""
    try:
        name = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # not a POSIX system, or no such name here
        return None
    return name if name and name.startswith("glibc") else None


def _from_environment(env: Mapping[str, str]) -> dict[str, str]:
    return {k: env[k] for k in ENV if k in env}


def describe(policy: str, env: Mapping[str, str] | None = None, library: str | None = "") -> str:
    """The method's sentence for ``policy`` in a process with environment ``env`` (default:
    this one's) and C library ``library`` (default: this one's)."""
    env = os.environ if env is None else env
    library = glibc() if library == "" else library
    if policy == "as-is":
        return "host allocator as each process found it (allocator='as-is')"
    if library is None:
        return "host allocator left as it is: not glibc malloc, whose thresholds settle sets"
    given = _from_environment(env)
    if given:
        values = ", ".join(f"{k}={v}" for k, v in given.items())
        return f"{library} malloc with the thresholds this environment sets ({values}), kept"
    return (
        f"{library} malloc settled in every measuring process: mmap threshold "
        f"{MMAP_THRESHOLD // 2**20} MiB, trim threshold {TRIM_THRESHOLD // 2**20} MiB (where "
        "glibc's own rule takes a long-running process), so that processes measure alike"
    )


def settle(policy: str) -> tuple[bool, str]:
    """Set this process's thresholds for ``policy`` where :func:`describe` says they are set;
    returns whether they were set here and the method's sentence. A C library that refuses them
    is said, not ignored."""
    sentence = describe(policy)
    if policy == "as-is" or glibc() is None or _from_environment(os.environ):
        return False, sentence
    try:
        libc = ctypes.CDLL(None)
        done = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        done = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    except (OSError, AttributeError) as exc:  # no mallopt to call in this process
        return False, f"host allocator left as it is: mallopt could not be called ({exc})"
    if not done:
        return False, "host allocator left as it is: glibc's mallopt refused the thresholds"
    return True, sentence


@contextmanager
def reserved(nbytes: int = RESERVE) -> Iterator[bool]:
    """``nbytes`` of heap faulted in ahead of steps run under a profiler, given back after;
    yields whether it was (0 bytes, or a C library other than glibc: not). For a process
    :func:`settle` settled only: it sets the trim threshold back to the settled one.

    A profiler's records are small allocations made between a step's tensors: they take parts of
    the blocks the step's tensors freed, so a later tensor of the same size no longer fits there
    and the heap grows into pages never touched, which fault on first use. Measured on mlp/small
    (one 2-core CPU): a bf16 plan's profiled steps faulted in about 4.5 MB most steps, its
    optimizer step (whose temporaries land there) ran 20-50 % longer than the fp32 plan's on the
    same fp32 weights, and the time split read bf16's speedup low. With ``nbytes`` of heap
    touched beforehand and the trim threshold raised above it while the steps run, the heap
    grows into pages already there; afterwards the threshold is set back and the free heap is
    returned (``malloc_trim``), so the memory a later step reads is not this reserve's."""
    if nbytes <= 0 or glibc() is None:
        yield False
        return
    import torch

    libc = ctypes.CDLL(None)
    libc.mallopt(_M_TRIM_THRESHOLD, nbytes + TRIM_THRESHOLD)
    try:
        size = MMAP_THRESHOLD // 2  # below the mmap threshold: from the heap, one after another
        blocks = [torch.ones(size, dtype=torch.uint8) for _ in range(max(nbytes // size, 1))]
        del blocks  # freed into the heap's top, kept there by the raised threshold
        yield True
    finally:
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        libc.malloc_trim(ctypes.c_size_t(0))  # given back now, not at some later free


def worker_env(env: Mapping[str, str], settled: bool) -> dict[str, str]:
    """``env`` for a fresh measuring process: with the settled thresholds added when this
    process settled its own (:func:`settle`); thresholds ``env`` sets are inherited as they are."""
    return dict(env, **ENV) if settled else dict(env)
