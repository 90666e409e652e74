"""The host allocator a measurement runs under: settled alike in every measuring process.

What glibc does with a block is read from glibc itself: a chunk it served by its own mapping has
the IS_MMAPPED bit (2) in the size word just before the pointer malloc returned. Each check runs
in a new interpreter, whose thresholds are glibc's starting ones (128 KiB) unless it settles them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from precision_nb.engine import allocator
from precision_nb.engine import measure_processes as MP
from precision_nb.engine.measure import MeasureConfig, PlanSpec, measure_plans

needs_glibc = pytest.mark.skipif(allocator.glibc() is None, reason="glibc malloc only")

#: Prints whether a 1 MiB block was mapped by glibc (its size word's IS_MMAPPED bit).
MAPPED = """
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
p = libc.malloc(2**20)
print(bool(ctypes.c_size_t.from_address(p - ctypes.sizeof(ctypes.c_size_t)).value & 2))
"""


def _mapped(prefix: str = "", env: dict[str, str] | None = None) -> bool:
    base = {k: v for k, v in os.environ.items() if k not in allocator.ENV}
    done = subprocess.run(
        [sys.executable, "-c", prefix + MAPPED], env={**base, **(env or {})},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip().splitlines()[-1] == "True"


@needs_glibc
def test_a_settled_process_keeps_a_1_mib_block_on_its_heap_and_a_fresh_one_maps_it():
    assert _mapped() is True  # glibc's starting threshold, 128 KiB
    settle = "from precision_nb.engine import allocator; print(allocator.settle('settled'))\n"
    assert _mapped(settle) is False
    assert _mapped("from precision_nb.engine import allocator; allocator.settle('as-is')\n")
    # a fresh measuring process is settled from its start by the environment it is given
    assert _mapped(env=allocator.worker_env({}, settled=True)) is False
    assert _mapped(env=allocator.worker_env({}, settled=False)) is True


@needs_glibc
def test_settle_says_what_it_did_and_keeps_thresholds_the_environment_sets(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    settled, sentence = allocator.settle("settled")
    assert settled and "mmap threshold 32 MiB, trim threshold 64 MiB" in sentence
    assert sentence.startswith(allocator.glibc())
    assert allocator.settle("as-is") == (False, allocator.describe("as-is"))
    assert "as each process found it" in allocator.describe("as-is")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    settled, sentence = allocator.settle("settled")
    assert not settled and "MALLOC_MMAP_THRESHOLD_=131072" in sentence and "kept" in sentence
    env = MP._worker_env("settled")  # the user's threshold reaches the fresh processes as it is
    assert env["MALLOC_MMAP_THRESHOLD_"] == "131072" and "MALLOC_TRIM_THRESHOLD_" not in env


def test_another_c_library_is_left_alone_and_said():
    sentence = allocator.describe("settled", env={}, library=None)
    assert "left as it is" in sentence and "not glibc" in sentence
    assert allocator.worker_env({"A": "1"}, settled=False) == {"A": "1"}
    assert allocator.worker_env({"A": "1"}, settled=True) == {"A": "1", **allocator.ENV}


@needs_glibc
def test_fresh_processes_get_the_settled_environment_and_as_is_adds_nothing(monkeypatch):
    for name in allocator.ENV:
        monkeypatch.delenv(name, raising=False)
    settled = MP._worker_env("settled")
    assert {k: settled[k] for k in allocator.ENV} == allocator.ENV
    assert settled["PYTHONPATH"]  # the package stays importable
    assert not set(allocator.ENV) & set(MP._worker_env("as-is"))


def test_the_policy_is_checked_and_the_method_names_the_allocator():
    with pytest.raises(ValueError, match=r"measure\.allocator: invalid value 'fast'.*'settled'"):
        MeasureConfig(allocator="fast")
    from test_engine_measure import Scripted

    cfg = MeasureConfig(rounds=2, warmup_max=0, allocator="as-is")
    m, _, _ = measure_plans(
        [PlanSpec("a"), PlanSpec("b")], lambda *a: Scripted(lambda k: 1.0), 2, cfg
    )
    assert m.method()["host allocator"] == allocator.describe("as-is")


#: In a settled process, prints whether reserved() acted (0 bytes, then 128 MiB), the RSS it
#: added, the page faults of 32 MiB of new tensors made inside it, and the RSS left once it is
#: over, those tensors still held (all in MiB or pages).
RESERVED = """
import resource
import torch
from precision_nb.engine import allocator

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

with allocator.reserved(0) as unsettled:
    pass
allocator.settle("settled")
before = rss()
with allocator.reserved(128 * 2**20) as acted:
    added = rss() - before
    f0 = faults()
    blocks = [torch.ones(2**20, dtype=torch.uint8) for _ in range(32)]
    new_faults = faults() - f0
after = rss() - before  # the reserve given back; the 32 MiB made inside it still held
del blocks
print(unsettled, acted, round(added), new_faults, round(after))
"""


@needs_glibc
def test_reserved_heap_is_faulted_in_ahead_used_without_faults_and_given_back_after():
    base = {k: v for k, v in os.environ.items() if k not in allocator.ENV}
    done = subprocess.run(
        [sys.executable, "-c", RESERVED], env=base, capture_output=True, text=True, check=True
    )
    unsettled, acted, added, new_faults, left = done.stdout.split()
    assert (unsettled, acted) == ("False", "True")  # 0 bytes: nothing done
    assert int(added) >= 120  # the 128 MiB were touched ahead
    assert int(new_faults) < 32 * 256 // 4  # 32 MiB of new tensors: 8,192 pages unreserved
    assert 32 <= int(left) <= 32 + 8, done.stdout  # given back on leaving, not at a later free
