"""The CUDA allocator peak window of an inspection opens before the model copy and the batch.

No GPU here: torch.cuda's memory queries are replaced by a small allocator that the test feeds
with what the inspection allocates on the "device": the copy of the model (as a model already on
the GPU is copied there), the batch, and the step's own tensors (the counted kinds the step makes,
all alive at once). Then everything counted lies inside the window, and ``peak - counted`` is the
part of the batch no kind counts: never negative. With the window opened after the copy, the gap
would be low by the copy's 4 bytes per fp32 parameter.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from precision_nb.engine.inspect import memory as mem
from precision_nb.engine.inspect import run_inspection
from precision_nb.engine.inspect import step as step_mod

CUDA = torch.device("cuda")


class FakeAllocator:
    """``torch.cuda``'s allocated / peak counters, fed by the test."""

    def __init__(self, held: int) -> None:
        self.allocated = self.peak = held

    def add(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def reset(self, device: object = None) -> None:
        self.peak = self.allocated

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: self.peak)


def _nbytes(tensors: object) -> int:
    items = tensors if isinstance(tensors, (tuple, list)) else [tensors]
    return sum(t.numel() * t.element_size() for t in items if isinstance(t, torch.Tensor))


def test_peak_minus_counted_is_not_negative_when_everything_counted_is_alive(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    batch = (torch.randn(16, 32), torch.randint(0, 4, (16,)))
    fake = FakeAllocator(held=params + 1000)  # the user's model is already on the GPU
    fake.patch(monkeypatch)
    real_copy, real_to, real_start, real_rows = (
        step_mod._copy, step_mod.to_device, mem.start_peak_window, mem.device_rows
    )  # fmt: skip

    def copy(m):
        fake.add(params)  # the copy is made on the model's device
        return real_copy(m)

    def to_device(b, dev):
        fake.add(_nbytes(b))
        return real_to(b, dev)

    def rows_after_step(dev, rows, base):
        made = {mem.PARAMS, mem.INPUTS}  # made before the step: the copy and the batch
        fake.add(sum(r["bytes"] or 0 for r in rows if r["counted"] and r["kind"] not in made))
        return real_rows(CUDA, rows, base)

    monkeypatch.setattr(step_mod, "_copy", copy)
    monkeypatch.setattr(step_mod, "to_device", to_device)
    monkeypatch.setattr(mem, "start_peak_window", lambda dev: real_start(CUDA))
    monkeypatch.setattr(mem, "device_rows", rows_after_step)
    data = run_inspection(model, [batch], "fp32", device="cpu")
    by_kind = {r["kind"]: r for r in data.memory}
    counted = data.model_bytes()
    inputs = sum(r["bytes"] or 0 for r in data.memory if r["kind"] == mem.INPUTS)
    assert by_kind[mem.PARAMS]["bytes"] == params
    assert by_kind[mem.ALLOC_PEAK]["bytes"] == counted + _nbytes(batch) - inputs
    gap = by_kind[mem.GAP]["bytes"]
    assert gap == _nbytes(batch) - inputs and gap >= 0  # the part of the batch no kind counts
