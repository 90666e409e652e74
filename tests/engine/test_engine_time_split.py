"""The time split: families from real profiles of models whose time is known by construction, the
classification on hand-built event trees, the reconciliation, the sentence and the advice."""

from __future__ import annotations

import copy
import dataclasses
import gc
import random
import re
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine import allocator
from precision_nb.engine.adamw_timing import AdamWTiming
from precision_nb.engine.time_split import (
    FAMILIES,
    STEP_MARK,
    SplitConfig,
    TimeSplit,
    advise,
    analyse_time,
    difference,
    profiler_busy,
    split_plans,
    split_trainer,
    this_process,
)
from precision_nb.engine.time_split import profiling as profiling_module
from precision_nb.engine.time_split.families import split_step, steps_of
from precision_nb.engine.time_split.profiling import CastSummary, MatmulShape
from precision_nb.engine.time_split.reconcile import NOTABLE, FamilyChange, changes, sentence
from precision_nb.engine.time_split.schedule import _without_profiler, schedule, without_profiler
from precision_nb.engine.time_split.shapes import lend, lend_steps, recorded
from precision_nb.engine.train_config import TrainConfig
from precision_nb.engine.trainer import Trainer

# ------------------------------------------------------------------ models known by construction


class OneMatmul(nn.Module):
    """One large matmul (1024 x 8192 x 256) of the batch with a fixed matrix held in ``dtype``
    (the batch comes in it too, so nothing but the output is cast), scaled by one trainable
    number: the step is the matmul; the mean of its output and the one-element AdamW step are
    tiny beside it."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.register_buffer("matrix", (torch.randn(8192, 256) / 90).to(dtype))
        self.gain = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # only the gain trains: the backward holds no matmul, and the loss reads the output once
        return (x @ self.matrix).float().mean() * self.gain


class ManyElementwise(nn.Module):
    """Many elementwise ops on a large activation and a 64-element weight: no matmul. Each op's
    work (8192 x 64 elements) dwarfs the Python and dispatch time between ops, which lands in
    "other": with a quarter of that activation, a CPU shared with busy processes put ~18 % of the
    step there and the elementwise share fell to 0.79."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(20):
            x = torch.tanh(x * self.scale + 0.1)
        return x.square().mean()


class Linear(nn.Module):
    """One linear layer (autocast casts its input and weight) and the model's own cast back."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(512, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).float().square().mean()


@pytest.fixture
def one_thread():
    """One intra-op thread: on a loaded machine a second thread's barrier waits land in
    whichever op happens to run, not in the op's own work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _trainer(model: nn.Module, batch: torch.Tensor, mode: str) -> Trainer:
    cfg = TrainConfig(steps=3, progress=False, measure_peak=False)
    t = Trainer(copy.deepcopy(model), lambda i: batch, device="cpu", precision=mode, train=cfg)
    t.fit(3)
    return t


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
@pytest.mark.parametrize(
    ("model", "shape", "family"),
    [(OneMatmul, (1024, 8192), "matmul"), (ManyElementwise, (8192, 64), "elementwise")],
)
def test_time_known_by_construction_lands_in_its_family(
    mode: str, model: type, shape: tuple[int, int], family: str, one_thread: None
) -> None:
    torch.manual_seed(0)
    dtype = torch.bfloat16 if mode == "bf16" and model is OneMatmul else torch.float32
    made = model(dtype) if model is OneMatmul else model()
    trainer = _trainer(made, torch.randn(*shape).to(dtype), mode)
    split = split_trainer(trainer, config=SplitConfig(steps=7, unprofiled=1))
    assert split.available, split.missing
    assert split.share(family) >= 0.80, {f: round(split.share(f), 3) for f in FAMILIES}
    assert sum(split.families.values()) == pytest.approx(split.step_s, rel=1e-6)
    assert split.sum_error is not None


def test_the_plans_are_profiled_together_in_rotated_blocks_and_left_as_they_were() -> None:
    cfg = SplitConfig(steps=4, unprofiled=3, block=2)
    assert schedule(["a", "b"], cfg) == [
        ("a", "warm"), ("b", "warm"),
        ("a", "settle"), ("a", "unprofiled"), ("a", "unprofiled"),  # 2 of 3 before, 1 after
        ("b", "settle"), ("b", "unprofiled"), ("b", "unprofiled"),
        ("b", "settle"), ("b", "profiled"), ("b", "profiled"),  # each round rotated by one
        ("a", "settle"), ("a", "profiled"), ("a", "profiled"),
        ("a", "settle"), ("a", "profiled"), ("a", "profiled"),
        ("b", "settle"), ("b", "profiled"), ("b", "profiled"),
        ("b", "settle"), ("b", "unprofiled"), ("a", "settle"), ("a", "unprofiled"),
        ("a", "shapes"), ("b", "shapes"),  # last: a step each that records the ops' shapes
    ]  # fmt: skip
    torch.manual_seed(0)
    trainers = {m: _trainer(Linear(), torch.randn(64, 512), m) for m in ("fp32", "bf16")}
    before = {m: copy.deepcopy(t.model.state_dict()) for m, t in trainers.items()}
    order: list[str] = []
    for label, trainer in trainers.items():  # which plan's step ran, in the order they ran
        forward = trainer.model.forward
        trainer.model.forward = lambda x, f=forward, k=label: (order.append(k), f(x))[1]
    cfg = SplitConfig(steps=2, unprofiled=1)
    out = split_plans(trainers, config=cfg)
    assert all(out[m].available and out[m].steps == 2 for m in trainers), out
    assert order == [label for label, _ in schedule(["fp32", "bf16"], cfg)]
    for m, trainer in trainers.items():
        assert torch.equal(before[m]["layer.weight"], trainer.model.state_dict()["layer.weight"])


def test_the_profilers_cost_is_taken_out_of_the_families() -> None:
    torch.manual_seed(0)
    trainer = _trainer(Linear(), torch.randn(64, 512), "bf16")
    split = split_trainer(trainer, config=SplitConfig(steps=3, unprofiled=2))
    assert split.unprofiled_s and split.traced_s > 0
    # what the trace holds, less the cost: the step without the profiler, no family below 0
    cost = max(split.traced_s - split.unprofiled_s, 0.0)
    assert split.profiler_s == pytest.approx(cost, abs=1e-12)
    assert split.step_s == pytest.approx(split.traced_s - cost)
    assert all(0 <= split.families[f] <= split.traced[f] for f in FAMILIES)
    assert sum(split.family_events.values()) == pytest.approx(split.events, abs=len(FAMILIES))
    assert split.sum_error == pytest.approx(split.traced_s / split.timer_s - 1)
    # on a CPU the cost goes to the families by their events; what one cannot give, to the rest
    traced = {f: 1.0 for f in FAMILIES}
    events = {"matmul": 10.0, "optimizer": 30.0}
    cpu = _without_profiler(traced, 0.4, events, kernels=False)
    assert cpu["matmul"] == pytest.approx(0.9) and cpu["optimizer"] == pytest.approx(0.7)
    assert all(cpu[f] == 1.0 for f in FAMILIES if f not in events)
    capped = _without_profiler({**traced, "matmul": 0.01}, 0.4, events, kernels=False)
    assert capped["matmul"] == 0.0 and capped["optimizer"] == pytest.approx(0.61)
    # on a GPU the host's cost delays kernels, so it comes out of the idle time only
    gpu = _without_profiler(traced, 0.5, events, kernels=True)
    assert gpu["other"] == 0.5 and all(gpu[f] == 1.0 for f in FAMILIES if f != "other")
    assert _without_profiler(traced, 5.0, events, kernels=True)["other"] == 0.0
    with pytest.raises(ValueError, match="block"):
        SplitConfig(block=0)
    no_steps = split_trainer(trainer, config=SplitConfig(steps=1, unprofiled=0))
    assert no_steps.profiler_s == 0 and no_steps.families == no_steps.traced
    kept = split_trainer(trainer, config=SplitConfig(steps=1, unprofiled=2, take_out=False))
    assert kept.unprofiled_s and kept.profiler_s == 0 and kept.families == kept.traced
    with pytest.raises(ValueError, match="take_out"):
        SplitConfig(take_out="no")


def test_the_profilers_cost_per_event_is_pooled_over_the_plans() -> None:
    def traced(label: str, seconds: float, unprofiled: float | None, events: int) -> TimeSplit:
        fam = {f: 0.0 for f in FAMILIES} | {"matmul": seconds / 2, "optimizer": seconds / 2}
        by_family = {"matmul": events / 4, "optimizer": events * 3 / 4}
        return TimeSplit(label, fam, step_s=seconds, traced=fam, traced_s=seconds,
                         unprofiled_s=unprofiled, events=events,
                         family_events=by_family)  # fmt: skip

    # 4 ms and 1 ms more than unprofiled over 400 and 600 events: 5 us per event, pooled
    splits = {"fp32": traced("fp32", 0.012, 0.008, 400), "bf16": traced("bf16", 0.007, 0.006, 600)}
    out = without_profiler(splits, kernels=False)
    assert out["fp32"].profiler_s == pytest.approx(0.002) and out["fp32"].step_s == (
        pytest.approx(0.010)
    )
    assert out["bf16"].profiler_s == pytest.approx(0.003) and out["bf16"].step_s == (
        pytest.approx(0.004)
    )
    # bf16's 3 ms by its events: a quarter from matmul, three quarters from the optimizer
    assert out["bf16"].families["matmul"] == pytest.approx(0.0035 - 0.00075)
    assert out["bf16"].families["optimizer"] == pytest.approx(0.0035 - 0.00225)
    assert out["fp32"].traced == splits["fp32"].traced  # the trace's own figures kept
    # casts' events are not counted: a plan whose extra events are casts is charged the same
    casting = traced("bf16", 0.010, 0.007, 400)
    casting = dataclasses.replace(
        casting, events=500, family_events={**casting.family_events, "casts": 100},
        traced={**casting.traced, "casts": 0.001}, traced_s=0.011,
    )  # fmt: skip
    both = without_profiler({"fp32": traced("fp32", 0.012, 0.008, 400), "bf16": casting},
                            kernels=False)  # fmt: skip
    assert both["fp32"].profiler_s == pytest.approx(both["bf16"].profiler_s) == pytest.approx(4e-3)
    assert both["bf16"].families["casts"] == 0.001  # nothing taken from the casts
    # a traced step under the unprofiled one costs nothing (never below 0); without unprofiled
    # steps nothing is taken
    slow = {"a": traced("a", 0.005, 0.006, 100)}
    assert without_profiler(slow, kernels=False)["a"].profiler_s == 0
    # a cost estimate over 75 % of a plan's step outside casts is noise: left in, and said
    # 1.9 and 8 ms over 100 events each: 4.95 ms for a, over 75 % of its 2 ms; none taken out
    noisy = {"a": traced("a", 0.002, 0.0001, 100), "b": traced("b", 0.010, 0.002, 100)}
    kept = without_profiler(noisy, kernels=False)
    assert all(k.profiler_s == 0 and k.families == k.traced for k in kept.values())
    assert (
        "estimated for a (4.95 ms per step) is over 75 % of its traced step"
        in (kept["b"].notes[-1])
    )
    none = {"a": traced("a", 0.005, None, 100), "b": traced("b", 0.005, 0.004, 100)}
    assert without_profiler(none, kernels=False) == none


def test_the_trainer_is_left_as_it_was() -> None:
    torch.manual_seed(0)
    trainer = _trainer(Linear(), torch.randn(64, 512), "bf16")
    before = copy.deepcopy(trainer.model.state_dict())
    name = "layer.weight"
    opt_step = copy.deepcopy(trainer.optimizer.state_dict()["state"][0]["step"])
    counters = (trainer.counters.steps, trainer.counters.attempts)
    rng = torch.get_rng_state()
    precision = dict(vars(trainer.precision))
    split = split_trainer(trainer, config=SplitConfig(steps=1, unprofiled=1))
    assert split.available and split.steps == 1
    assert torch.equal(before[name], trainer.model.state_dict()[name])
    assert torch.equal(opt_step, trainer.optimizer.state_dict()["state"][0]["step"])
    assert (trainer.counters.steps, trainer.counters.attempts) == counters
    assert torch.equal(rng, torch.get_rng_state())
    now = vars(trainer.precision)  # the same scaler object, the same settings
    assert set(now) == set(precision) and all(now[k] is v for k, v in precision.items())


def test_a_step_the_loss_scale_skips_is_one_more_attempt_under_its_mark() -> None:
    """The CPU loss-scale lab tries a step again after an overflow: each try has its own mark,
    time and record, so the split reads every attempt and counts the skipped ones."""
    torch.manual_seed(0)
    batch = torch.randn(64, 512)
    cfg = TrainConfig(steps=8, progress=False, measure_peak=False, init_scale=2.0**40,
                      growth_interval=1)  # fmt: skip
    lab = PrecisionConfig(mode="fp16", loss_scale_lab=True)
    trainer = Trainer(Linear(), lambda i: batch, device="cpu", precision=lab, train=cfg)
    trainer.fit(2)
    grows = dataclasses.replace(cfg, init_scale=2.0**6)
    plain = Trainer(Linear(), lambda i: batch, device="cpu", precision=lab, train=grows)
    plain.fit(2)
    attempts = trainer.counters.attempts
    splits = split_plans({"skips": trainer, "plain": plain}, config=SplitConfig(steps=4))
    assert trainer.counters.attempts == attempts  # restored as the trainer was
    assert splits["skips"].available, splits["skips"].missing
    assert splits["skips"].skipped >= 1 and splits["plain"].available


def test_a_busy_profiler_leaves_a_missing_split_that_says_why() -> None:
    trainer = _trainer(Linear(), torch.randn(64, 512), "fp32")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert profiler_busy()
        split = split_trainer(trainer, measured_s=0.01)
    assert not profiler_busy()
    assert not split.available and "another profiler" in split.missing
    assert split.measured_s == 0.01 and split.families == {}


def test_a_device_the_profiler_cannot_see_leaves_a_split_that_says_why() -> None:
    trainer = types.SimpleNamespace(label="bf16", device=torch.device("meta"))
    split = split_trainer(trainer, measured_s=0.02)
    assert not split.available and split.measured_s == 0.02
    assert split.missing == "the profiler cannot see work on meta; supported: cpu, cuda, mps"


class Fails(Linear):
    """Raises its own error once ``fail`` is set (after the timed steps)."""

    fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise KeyError("the model's own error")
        return super().forward(x)


def test_a_models_error_in_the_profiled_steps_leaves_a_split_that_says_so() -> None:
    trainer = _trainer(Fails(), torch.randn(64, 512), "bf16")
    before = copy.deepcopy(trainer.model.state_dict())
    trainer.model.fail = True
    split = split_trainer(trainer, measured_s=0.01)
    assert not split.available and "KeyError" in split.missing
    assert "the model's own error" in split.missing
    assert torch.equal(before["layer.weight"], trainer.model.state_dict()["layer.weight"])
    assert not profiler_busy()  # the profiler was stopped


def test_a_failed_plan_has_no_split_and_the_difference_says_so() -> None:
    torch.manual_seed(0)
    trainers = {m: _trainer(Linear(), torch.randn(64, 512), m) for m in ("fp32", "bf16")}
    out = analyse_time(
        trainers, {"fp32": 0.01, "bf16": 0.01}, {}, "fp32", failures={"bf16": "out of memory"},
        config=SplitConfig(steps=1, unprofiled=0),
    )  # fmt: skip
    assert out.splits["fp32"].available
    assert "the plan failed" in out.splits["bf16"].missing and "out of memory" in (
        out.splits["bf16"].missing
    )
    assert "has no split" in out.differences["bf16"].missing
    assert out.advice["bf16"] == ()
    rows = [r for r in out.rows() if r["run"] == "bf16"]
    assert len(rows) == 1 and rows[0]["family"] is None and "failed" in rows[0]["missing"]


def test_casts_are_counted_with_their_bytes_and_autocast_tells_its_own() -> None:
    torch.manual_seed(0)
    trainer = _trainer(Linear(), torch.randn(64, 512), "bf16")
    split = split_plans({"bf16": trainer}, config=SplitConfig(steps=1, unprofiled=0))["bf16"]
    casts = split.casts
    # autocast casts the input (64x512) and the weight (512x512) to bf16 in the forward; the
    # model's own .float() of the output is not autocast's
    assert casts.autocast_count >= 2
    assert casts.autocast_nbytes >= (64 * 512 + 64 * 512) * 2
    assert casts.count > casts.autocast_count
    assert any(m.dtype == "c10::BFloat16" and (m.m, m.k, m.n) == (64, 512, 64)
               for m in split.matmuls)  # fmt: skip


# ------------------------------------------------------------------ hand-built event trees


@dataclass
class Kernel:
    name: str
    duration: float


@dataclass
class Range:
    start: float
    end: float


@dataclass
class Ev:
    name: str
    self_cpu_time_total: float = 0.0
    cpu_children: list[Any] = field(default_factory=list)
    input_dtypes: list[str] = field(default_factory=list)
    input_shapes: list[list[int]] = field(default_factory=list)
    sequence_nr: int = -1
    kernels: list[Kernel] = field(default_factory=list)
    thread: int = 1
    cpu_parent: Any = None
    time_range: Range = field(default_factory=lambda: Range(0.0, 0.0))

    @property
    def cpu_time_total(self) -> float:
        return self.self_cpu_time_total + sum(c.cpu_time_total for c in self.cpu_children)


def cast(n: int, seq: int = -1, src: str = "float", dst: str = "c10::BFloat16") -> Ev:
    copy_ = Ev("aten::copy_", 5.0, input_dtypes=[dst, src, "Scalar"], input_shapes=[[n], [n], []])
    inner = Ev("aten::_to_copy", 1.0, [Ev("aten::empty_strided", 1.0), copy_], sequence_nr=seq)
    return Ev("aten::to", 1.0, [inner], sequence_nr=seq)


def test_families_on_a_hand_built_step() -> None:
    addmm = Ev(
        "aten::addmm", 40.0, [Ev("aten::expand", 1.0)],
        input_dtypes=["c10::BFloat16"] * 3, input_shapes=[[30], [64, 20], [20, 30]],
    )  # fmt: skip
    linear = Ev("aten::linear", 2.0, [cast(600, seq=7), addmm], sequence_nr=7)
    backward = Ev("autograd::engine::evaluate_function: ToCopyBackward0", 3.0,
                  [Ev("ToCopyBackward0", 1.0, [cast(600, src="c10::BFloat16", dst="float")],
                      sequence_nr=7)])  # fmt: skip
    user = cast(100)  # the model's own cast: no op issued it
    optimizer = Ev("Optimizer.step#AdamW.step", 4.0, [Ev("aten::mul_", 6.0), cast(10)])
    mark = Ev(STEP_MARK, 10.0, [linear, Ev("aten::gelu", 8.0), Ev("aten::view", 1.0),
                                backward, user, optimizer])  # fmt: skip
    split = split_step(mark)
    us = {k: round(v * 1e6, 6) for k, v in split.families.items()}
    assert us["matmul"] == 2 + 40 + 1
    assert us["casts"] == 8 * 3
    assert us["elementwise"] == 8
    assert us["data"] == 1
    assert us["optimizer"] == 4 + 6 + 8  # a cast inside the optimizer is the optimizer's
    assert us["other"] == 10 + 3 + 1  # the mark, the autograd wrappers
    assert sum(us.values()) == pytest.approx(mark.cpu_time_total)
    # every event: the mark, linear (4 of its cast, addmm, expand), gelu, view, the backward
    # wrapper and node (4 of its cast), the model's cast, the optimizer (mul_, 4 of its cast)
    assert split.events == 1 + (1 + 4 + 2) + 1 + 1 + (2 + 4) + 4 + (2 + 4)
    autocast = [c.autocast for c in split.casts]
    assert autocast == [True, True, False]  # linear's cast, its backward, the model's own
    assert split.casts[0].nbytes == 600 * 2 and split.casts[1].nbytes == 600 * 4
    (mm,) = split.matmuls
    assert (mm.op, mm.m, mm.k, mm.n, mm.dtype) == ("addmm", 64, 20, 30, "c10::BFloat16")
    assert mm.seconds == pytest.approx(41e-6)
    # a plan without autocast: the same casts, none of them autocast's
    assert [c.autocast for c in split_step(mark, autocast=False).casts] == [False] * 3


def test_a_matmul_autocast_calls_again_is_read_at_the_inner_call() -> None:
    inner = Ev("aten::addmm", 30.0, input_dtypes=["c10::BFloat16"] * 3,
               input_shapes=[[8], [4, 16], [16, 8]])  # fmt: skip
    outer = Ev("aten::addmm", 2.0, [cast(16 * 8, seq=3), inner],
               input_dtypes=["float"] * 3, input_shapes=[[8], [4, 16], [16, 8]])  # fmt: skip
    (mm,) = split_step(Ev(STEP_MARK, 1.0, [outer])).matmuls
    assert (mm.m, mm.k, mm.n, mm.dtype) == (4, 16, 8, "c10::BFloat16")
    assert mm.seconds == pytest.approx(30e-6)  # the matmul, not the casts before it


def test_device_view_counts_kernels_and_the_idle_gpu() -> None:
    mm = Ev("aten::mm", 50.0, kernels=[Kernel("ampere_bf16_gemm_128x64", 300.0)])
    region = Ev("Torch-Compiled Region: 0/0", 20.0,
                kernels=[Kernel("triton_poi_fused_add_0", 40.0),
                         Kernel("triton_tem_fused_mm_1", 100.0)])  # fmt: skip
    allreduce = Ev("c10d::allreduce_", 5.0, kernels=[Kernel("ncclDevKernel_AllReduce", 60.0)])
    copy_ = Ev("aten::copy_", 5.0, input_dtypes=["float", "float"], input_shapes=[[4], [4]],
               kernels=[Kernel("Memcpy HtoD", 10.0)])  # fmt: skip
    mark = Ev(STEP_MARK, 1000.0, [mm, region, allreduce, copy_])
    split = split_step(mark, device=True)
    us = {k: round(v * 1e6, 6) for k, v in split.families.items()}
    assert us["matmul"] == 300 + 100  # the compiled template matmul by its kernel's name
    assert us["compiled"] == 40 and us["communication"] == 60 and us["data"] == 10
    assert us["other"] == pytest.approx(mark.cpu_time_total - 510)  # the GPU idle
    assert split.overlap_s == 0


def test_other_threads_count_and_an_overlap_is_reported() -> None:
    mark = Ev(STEP_MARK, 2.0, [Ev("aten::mm", 10.0)], time_range=Range(0.0, 12.0))
    side = Ev("aten::add", 30.0, thread=2, time_range=Range(1.0, 31.0))
    late = Ev("aten::add", 30.0, thread=2, time_range=Range(50.0, 80.0))
    (split,) = steps_of([mark, side, late])
    assert split.families["elementwise"] == pytest.approx(30e-6)  # the late one is not in it
    assert split.families["other"] == 0 and split.overlap_s == pytest.approx(28e-6)


# ------------------------------------------------------------------ reconciliation and sentence


def _split(label: str, **families: float) -> TimeSplit:
    fam = {f: families.get(f, 0.0) for f in FAMILIES}
    traced = {f: v * 1.1 for f, v in fam.items()}  # the profiler's cost: 10 % more per family
    return TimeSplit(label, fam, step_s=sum(fam.values()), traced=traced,
                     traced_s=sum(traced.values()), timer_s=sum(traced.values()), steps=3,
                     unprofiled_s=sum(fam.values()), view="test")  # fmt: skip


@dataclass
class Speed:
    estimate: float
    low: float | None
    high: float | None


def test_reconstruction_is_the_product_of_the_family_factors() -> None:
    base = _split("fp32", matmul=6e-3, optimizer=2e-3, other=1e-3)
    plan = _split("bf16", matmul=2e-3, casts=1e-3, optimizer=2e-3, other=1e-3)
    d = difference(base, plan, Speed(1.5, 1.45, 1.55), tolerance=0.1)
    product = 1.0
    for c in d.changes:
        product *= c.factor
    assert 1 / product == pytest.approx(d.reconstructed) == pytest.approx(9 / 6)
    assert d.agrees is True and "within" in d.reconcile
    off = difference(base, plan, Speed(2.0, 1.9, 2.1), tolerance=0.1)
    assert off.agrees is False and "does not add up" in off.reconcile
    assert "fp32 9.0 ms (profiled 9.9 ms, 0 events)" in off.reconcile  # both plans' steps
    assert "bf16 6.0 ms (profiled 6.6 ms, 0 events)" in off.reconcile
    assert difference(base, plan, None).agrees is None


@dataclass
class Calibrated(Speed):
    processes: int = 1
    process_ratios: tuple[float, ...] = ()


def test_a_split_is_held_against_its_own_process_when_others_measured_too() -> None:
    base = _split("fp32", matmul=6e-3, optimizer=2e-3, other=1e-3)
    plan = _split("bf16", matmul=2e-3, casts=1e-3, optimizer=2e-3, other=1e-3)  # 1.5x
    calibrated = Calibrated(1.3, 1.25, 1.35, 5, (1.2, 1.25, 1.3, 1.35, 1.52))
    inside = difference(base, plan, calibrated, tolerance=0.05, here=Speed(1.52, 1.45, 1.6))
    assert inside.agrees is True and (inside.process, inside.process_low) == (1.52, 1.45)
    assert (
        "within this process's timed 1.520× (1.450–1.600 over its rounds) widened by ±5 %; the "
        "calibrated 1.300× (1.250–1.350) is over 5 processes, this one among them, single "
        "processes 1.20–1.52" in inside.reconcile
    )
    outside = difference(base, plan, calibrated, tolerance=0.05, here=Speed(1.2, 1.15, 1.25))
    assert outside.agrees is False and "outside this process's timed 1.200×" in outside.reconcile
    # without other processes the calibrated speedup is this process's: held against it
    alone = difference(base, plan, calibrated, tolerance=0.05)
    assert alone.agrees is False and alone.process is None
    assert "outside the calibrated 1.300× (1.250–1.350) widened" in alone.reconcile


def test_this_process_is_the_first_processes_rounds_only_when_others_measured() -> None:
    def plan(blocks: list[list[float]]) -> Any:
        return types.SimpleNamespace(blocks=blocks)

    blocks = [[2.0, 2.0], [2.2, 2.2], [2.0, 2.1], [2.1, 2.0]]
    measured = types.SimpleNamespace(
        process_count=3, plans={"fp32": plan(blocks), "bf16": plan([[1.0, 1.0]] * 4)}
    )
    here = this_process(measured, "fp32")
    assert set(here) == {"bf16"} and here["bf16"].estimate == pytest.approx(2.05, rel=0.03)
    assert this_process(types.SimpleNamespace(process_count=1, plans={}), "fp32") == {}
    assert this_process(None, "fp32") == {} and this_process(measured, None) == {}


def test_the_sentence_is_true_whatever_the_numbers() -> None:
    rng = random.Random(3)
    for _ in range(300):
        base = _split("fp32", **{f: rng.choice([0, rng.uniform(1e-5, 5e-3)]) for f in FAMILIES})
        plan = _split("bf16", **{f: rng.choice([0, rng.uniform(1e-5, 5e-3)]) for f in FAMILIES})
        if base.step_s == 0 or plan.step_s == 0:
            continue
        d = difference(base, plan, None)
        said = d.sentence
        overall = float(re.search(r": ([0-9.]+)× overall", said).group(1))
        assert overall == pytest.approx(base.step_s / plan.step_s, rel=0.006)
        assert ("(faster)" in said) == (d.reconstructed > 1)
        assert ("(slower)" in said) == (d.reconstructed < 1)
        for c in d.changes:
            if abs(c.change_s) < NOTABLE * base.step_s:
                continue
            verb = "saved" if c.change_s < 0 else ("added" if c.baseline_s == 0 else "spent")
            assert re.search(verb + r" [0-9.e+-]+ ms", said)
        if d.reconstructed < 1 and any(c.change_s > 0 for c in d.changes):
            losses = [m.start() for m in re.finditer(r"spent|added", said)]
            gains = [m.start() for m in re.finditer(r"saved", said)]
            if losses and gains:
                assert min(losses) < min(gains)  # a slower plan says first where it lost


def test_sentence_names_the_unchanged_optimizer_with_its_optimizer() -> None:
    found = changes(_split("fp32", matmul=6e-3, optimizer=2e-3), _split("bf16", matmul=2e-3,
                    optimizer=2e-3, casts=0.5e-3))  # fmt: skip
    said = sentence("bf16", found, 8 / 4.5, "plain AdamW on float32 weights")
    assert said.startswith("bf16 saved 4.0 ms in matmuls (3× faster there), added 0.5 ms of casts")
    assert "left the 2.0 ms optimizer step about the same (plain AdamW on float32 weights)" in said
    assert said.endswith("1.78× overall in the profiled steps (faster).")
    same = sentence("x", changes(_split("a", matmul=1e-3), _split("b", matmul=1e-3)), 1.0)
    assert "moved no family" in same and "(the same)" in same


def test_family_change_ratio() -> None:
    assert FamilyChange("matmul", 4e-3, 2e-3, 0.5).times_faster == 2
    assert FamilyChange("casts", 0.0, 2e-3, 1.2).times_faster is None


# ------------------------------------------------------------------ advice


def test_each_advice_comes_with_its_figure_and_only_above_its_threshold() -> None:
    split = _split("bf16", matmul=2e-3, casts=1e-3, optimizer=3e-3, other=4e-3)
    split = TimeSplit(
        **{
            **split.__dict__,
            "casts": CastSummary(10, 2**21, 1e-3, 8, 2**20),
            "matmuls": (
                MatmulShape("addmm", 64, 20, 30, "c10::BFloat16", 2, 1e-3),
                MatmulShape("mm", 64, 64, 64, "c10::BFloat16", 2, 1e-3),
            ),
        }
    )
    timing = AdamWTiming("cpu", 2, 100, 7, 10, 3e-3, 1e-4, 1e-3, 1e-4, 3.0, 2.5, 3.5)
    base = _split("fp32", matmul=3e-3, optimizer=3e-3, other=4e-3)
    diff = difference(base, split, None)
    found = {a.kind: a for a in advise(split, diff, emulated="no AVX512-BF16", fused=False,
                                       adamw=timing)}  # fmt: skip
    assert set(found) == {"outside_ops", "casts", "unaligned", "emulated_bf16", "optimizer"}
    assert found["outside_ops"].figures["share"] == pytest.approx(0.4)
    assert "2.5×" in found["outside_ops"].message  # the bound 1 / share
    assert found["casts"].figures["bytes"] == 2**21 and "2.00 MiB" in found["casts"].message
    assert found["unaligned"].figures["shapes"] == [("addmm", 64, 20, 30, "c10::BFloat16")]
    assert found["optimizer"].figures["ratio"] == 3.0
    # its milliseconds are time_adamw's, timed apart, and it says so beside the profiled step's
    assert "(3.0 ms) with plain AdamW" in found["optimizer"].message
    assert "timed apart from the training step (time_adamw: 3.0 ms against 1.0 ms" in (
        found["optimizer"].message
    )
    assert "1.5× the baseline's speed" in found["emulated_bf16"].message
    quiet = _split("bf16", matmul=9e-3, other=1e-3)
    assert advise(quiet, None, fused=True, adamw=timing) == ()
    slow_fused = AdamWTiming("cpu", 2, 100, 7, 10, 3e-3, 1e-4, 4e-3, 1e-4, 0.8, 0.7, 0.9)
    assert not [a for a in advise(split, fused=False, adamw=slow_fused) if a.kind == "optimizer"]
    assert advise(TimeSplit("x", missing="no profiler")) == ()


def test_collectives_of_a_real_ddp_step_are_communication(tmp_path) -> None:
    dist = torch.distributed
    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)  # fmt: skip
    model = None
    try:
        model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64))
        x = torch.randn(32, 64)
        model(x).sum().backward()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with torch.profiler.record_function(STEP_MARK):
                model(x).sum().backward()
    finally:
        # DDP's reducer holds the group: freed while the group is alive, not after it is
        # destroyed (its gloo threads were then joined at the function's end and could hang)
        model = None
        gc.collect()
        dist.destroy_process_group()
    (split,) = steps_of(prof.events())
    assert split.families["communication"] > 0
    assert {"c10d::allreduce_"} <= set(split.ops["communication"])


def test_a_distributed_comparison_says_why_it_has_no_split() -> None:
    from precision_nb.engine.comparison import Comparison, PlanOutcome
    from precision_nb.engine.time_split import DISTRIBUTED, split_missing

    runs = {"fp32": None, "bf16": None}
    comparison = Comparison(results=runs, outcomes={k: PlanOutcome(k) for k in runs})
    comparison.baseline = "fp32"
    split_missing(comparison, DISTRIBUTED)
    for label in runs:
        split = comparison.outcomes[label].time_split
        assert split is comparison.time_split.splits[label]
        assert not split.available and "torchrun's ranks" in split.missing
    rows = comparison.time_split.rows()
    assert [r["run"] for r in rows] == ["fp32", "bf16"] and all(r["missing"] for r in rows)


# --- shapes recorded in a step of their own (engine/time_split/shapes.py) ---


def _cp(n: int | None = None, src: str = "float", dst: str = "c10::BFloat16") -> Ev:
    """A cast's copy; ``n`` None: as a trace without shapes records it."""
    if n is None:
        return Ev("aten::copy_", 1.0)
    return Ev("aten::copy_", 1.0, input_dtypes=[dst, src, "Scalar"], input_shapes=[[n], [n], []])


def _mm(shapes: list[list[int]] | None = None) -> Ev:
    if shapes is None:
        return Ev("aten::mm", 10.0)
    return Ev("aten::mm", 10.0, input_dtypes=["c10::BFloat16"] * 2, input_shapes=shapes)


def _lin(cast: Ev, mm: Ev) -> Ev:
    to = Ev("aten::to", 1.0, [Ev("aten::_to_copy", 1.0, [cast])])
    return Ev("aten::linear", 1.0, [to, mm])


def _marked(start: float, *children: Ev) -> Ev:
    return Ev(f"{STEP_MARK}#0", 1.0, list(children), time_range=Range(start, start + 1.0))


def test_each_op_takes_the_shapes_of_its_namesake_at_the_same_place() -> None:
    shaped = _marked(
        0.0,
        _lin(_cp(600), _mm([[4, 30], [30, 20]])),
        _lin(_cp(80), _mm([[4, 20], [20, 4]])),
    )
    timed = _marked(5.0, _lin(_cp(), _mm()), _lin(_cp(), _mm()))
    found = recorded([shaped])
    assert [len(v) for v in found.values()] == [2, 2]  # copies and matmuls, in walk order
    assert lend([timed], found) == 0
    split = split_step(timed)
    # bf16 bytes written: the first copy is the 600-element one, the second the 80-element one
    assert [c.nbytes for c in split.casts] == [600 * 2, 80 * 2]
    assert [(m.m, m.k, m.n) for m in split.matmuls] == [(4, 30, 20), (4, 20, 4)]
    # without the lent shapes the same step has neither casts nor matmul shapes
    bare = split_step(_marked(5.0, _lin(_cp(), _mm()), _lin(_cp(), _mm())))
    assert bare.casts == [] and bare.matmuls == []


def test_a_step_whose_ops_differ_counts_what_had_no_match_and_the_split_says_so() -> None:
    shaped = _marked(0.0, _lin(_cp(600), _mm([[4, 30], [30, 20]])))
    timed = [
        _marked(5.0, _lin(_cp(), _mm())),
        _marked(7.0, _lin(_cp(), _mm()), _cp()),  # a copy more than the shapes step has
    ]
    notes = lend_steps(timed, [shaped], f"{STEP_MARK}#0")
    (note,) = notes
    assert "over 2 steps, 1 of their copies, matmuls and convolutions had no match" in note
    assert [c.nbytes for c in split_step(timed[1]).casts] == [600 * 2]  # the matched one
    assert lend_steps([_marked(5.0, _lin(_cp(), _mm()))], [shaped], f"{STEP_MARK}#0") == ()
    (none,) = lend_steps(timed, [], f"{STEP_MARK}#0")
    assert none.startswith("no step recorded the ops' input shapes")


def test_the_timed_steps_run_without_shapes_and_still_tell_autocasts_casts(monkeypatch) -> None:
    calls: list[dict[str, Any]] = []
    real = profiling_module.profile

    def recording(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(profiling_module, "profile", recording)
    torch.manual_seed(0)
    trainer = _trainer(Linear(), torch.randn(64, 512), "bf16")
    (split,) = split_plans({"bf16": trainer}, config=SplitConfig(steps=3, unprofiled=2)).values()
    assert split.available, split.missing
    # the timed steps' profiler records no shapes; the shapes step's does, after it
    assert [c.get("record_shapes") for c in calls] == [False, True]
    # autocast's casts of the weight and bias (bf16 copies written), read through the lent shapes
    assert split.casts.autocast_count >= 2
    assert split.casts.autocast_nbytes >= (64 * 512 + 64) * 2
    assert {(m.m, m.k, m.n) for m in split.matmuls} >= {(64, 512, 64)}
    assert not any("no match" in n for n in split.notes), split.notes


def test_heap_faulted_in_ahead_of_the_short_fit_is_said_and_only_when_asked() -> None:
    torch.manual_seed(0)
    trainer = _trainer(Linear(), torch.randn(64, 512), "bf16")
    plain = split_plans({"bf16": trainer}, config=SplitConfig(steps=2, unprofiled=0))["bf16"]
    assert profiling_module.HEAP_AHEAD not in plain.notes
    if allocator.glibc() is None:
        return
    allocator.settle("settled")  # the trim threshold it sets back to is the settled one
    cfg = SplitConfig(steps=2, unprofiled=0, heap_ahead=8 * 2**20)
    ahead = split_plans({"bf16": trainer}, config=cfg)["bf16"]
    assert ahead.available and ahead.notes[0] == profiling_module.HEAP_AHEAD
    with pytest.raises(ValueError, match="heap_ahead"):
        SplitConfig(heap_ahead=-1)
