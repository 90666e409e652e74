"""The split reads a CPU trace straight from the profiler's result (``trace.host_events``): the
same step splits as from ``prof.events()``, field for field, on real traces."""

from __future__ import annotations

import threading

import torch
from split_traces import assert_same_splits, profiled_steps, train_step

from precision_nb.engine.time_split.trace import host_events


def test_an_mlp_step_under_autocast_splits_the_same_either_way() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 8)
    )
    for autocast in (False, True):
        prof = profiled_steps(train_step(model, torch.randn(16, 32), autocast))
        assert_same_splits(prof, 3, autocast)


def test_an_attention_layer_splits_the_same_either_way() -> None:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    prof = profiled_steps(train_step(layer, torch.randn(4, 10, 32), True), steps=2)
    assert_same_splits(prof, 2, True)


def test_a_trace_with_a_range_on_another_thread_keeps_it_out_of_the_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    step = train_step(model, torch.randn(4, 8), False)

    def with_a_thread() -> None:
        worker = threading.Thread(target=lambda: torch.ones(4).add_(1))
        worker.start()
        step()
        worker.join()

    prof = profiled_steps(with_a_thread, steps=2)
    assert_same_splits(prof, 2, False)


class Raw:
    """A recorded event as the profiler's result gives it (only what the reader asks)."""

    def __init__(self, name: str, start: int, end: int, thread: int = 1, ends_on: int = 1):
        self.fields = (name, start, end, thread, ends_on)

    def name(self) -> str:
        return self.fields[0]

    def start_ns(self) -> int:
        return self.fields[1]

    def end_ns(self) -> int:
        return self.fields[2]

    def start_thread_id(self) -> int:
        return self.fields[3]

    def end_thread_id(self) -> int:
        return self.fields[4]

    def device_type(self) -> torch.autograd.DeviceType:
        return torch.autograd.DeviceType.CPU

    def is_async(self) -> bool:
        return False

    def shapes(self) -> list:
        return []

    def dtypes(self) -> list:
        return []

    def sequence_nr(self) -> int:
        return -1


def stopped(raw: list[Raw]) -> object:
    """An object shaped like a stopped ``torch.profiler.profile`` holding ``raw``."""

    class Result:
        def trace_start_ns(self) -> int:
            return 0

        def events(self) -> list[Raw]:
            return raw

    class Prof:
        class profiler:  # noqa: N801 - the attribute torch.profiler.profile has
            kineto_results = Result()

    return Prof()


def test_an_async_range_stays_out_of_the_tree_with_no_self_time() -> None:
    events = host_events(
        stopped([
            Raw("step", 0, 10_000), Raw("aten::mm", 1_000, 4_000),
            Raw("async", 2_000, 3_000, ends_on=2), Raw("aten::_version", 5_000, 6_000),
        ])
    )  # fmt: skip
    assert events is not None
    step, mm, async_ = events  # the left-out name is gone
    assert [c.name for c in step.cpu_children] == ["aten::mm"] and not mm.cpu_children
    assert async_.cpu_parent is None and async_.self_cpu_time_total == 0.0
    assert step.self_cpu_time_total == 7.0 and mm.cpu_time_total == 3.0  # microseconds


def test_a_parent_whose_only_child_repeats_its_name_takes_its_place() -> None:
    events = host_events(
        stopped([Raw("aten::add", 0, 10_000), Raw("aten::add", 1_000, 9_000),
                 Raw("aten::copy_", 2_000, 3_000)])
    )  # fmt: skip
    assert events is not None
    assert [e.name for e in events] == ["aten::add", "aten::copy_"]
    assert [e.name for e in host_events(stopped([Raw("ProfilerStep#3", 0, 9)])) or []] == [
        "ProfilerStep*"  # as events() names a schedule's steps
    ]
    assert events[1].cpu_parent is events[0]
    assert events[0].self_cpu_time_total == 9.0


def test_a_trace_with_device_activity_is_left_to_the_profilers_own_events() -> None:
    class Kernel(Raw):
        def device_type(self) -> torch.autograd.DeviceType:
            return torch.autograd.DeviceType.CUDA

    assert host_events(stopped([Raw("step", 0, 10), Kernel("gemm", 1, 2)])) is None
    assert host_events(object()) is None  # not a profiler that has run
