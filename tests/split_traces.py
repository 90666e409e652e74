"""Real traces read both ways: ``trace.host_events`` against ``prof.events()`` (the tests of
:mod:`precision_nb.engine.time_split.trace`, on models written here and on third-party ones)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from precision_nb.engine.time_split.families import STEP_MARK, steps_of
from precision_nb.engine.time_split.trace import host_events


def profiled_steps(step: Callable[[], None], steps: int = 3) -> torch.profiler.profile:
    """A stopped CPU profiler around ``steps`` calls of ``step``, each inside the step mark."""
    step()  # the first call's one-off work (the optimizer's state) is not traced
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            with torch.profiler.record_function(STEP_MARK):
                step()
    return prof


def assert_same_splits(prof: torch.profiler.profile, steps: int, autocast: bool) -> None:
    fast = host_events(prof)
    assert fast is not None
    slow = list(prof.events())
    assert len(fast) == len(slow)
    assert [e.name for e in fast] == [e.name for e in slow]
    for a, b in zip(fast, slow, strict=True):
        assert [c.name for c in a.cpu_children] == [c.name for c in b.cpu_children]
        assert a.self_cpu_time_total == b.self_cpu_time_total
    got, want = steps_of(fast, autocast=autocast), steps_of(slow, autocast=autocast)
    assert len(got) == len(want) == steps
    assert got == want  # families, ops, casts with their bytes, matmul shapes, event counts


def train_step(model: torch.nn.Module, x: torch.Tensor, autocast: bool) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step
