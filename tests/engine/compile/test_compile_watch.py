"""A real inductor compile through the Trainer: the compile step apart from every training step,
torch's accounting and cache outcome, a recompilation with its reason, the CUDA-graph skip on
CPU, and a compiled run that trains what the eager run trains.

Compiling costs seconds even for a tiny model (a minute on a busy 2-core machine), so ONE
module-scoped run compiles once and recompiles once; every test reads it.
"""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import precision_nb as pnb
from precision_nb.core.amp import autocast_context
from precision_nb.engine.compile.agreement import agreement
from precision_nb.engine.compile.record import CompileLog, reset_compiled
from precision_nb.engine.compile.torch_state import TorchWatch, _metrics_module
from precision_nb.engine.compile.visibility import DISPATCH_MODE_SKIP, inspection_caveats
from precision_nb.engine.train_config import TrainConfig
from precision_nb.engine.trainer import Trainer


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 4))


@pytest.fixture(scope="module")
def watched():
    reset_compiled()
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen))
               for _ in range(6)]  # fmt: skip
    batches.append((torch.randn(5, 16, generator=gen), torch.randint(0, 4, (5,), generator=gen)))
    train = TrainConfig(steps=7, log_every=1, progress=False, measure_peak=False)
    initial = tiny()
    # Dropout draws from inductor's own generator in compiled code; fallback_random makes it
    # draw eager's numbers, so the two runs can be compared step by step (what the agreement
    # message advises for models with random ops).
    import torch._inductor.config as inductor_config

    optimizer = pnb.OptimizerConfig(lr=1e-2)
    with inductor_config.patch(fallback_random=True):
        compiled = Trainer(copy.deepcopy(initial), batches, device="cpu", precision="bf16",
                           train=train, compile="reduce-overhead", optimizer=optimizer)  # fmt: skip
        result = compiled.fit()
    eager = Trainer(copy.deepcopy(initial), batches, device="cpu", precision="bf16",
                    train=dataclasses.replace(train, steps=6), optimizer=optimizer)  # fmt: skip
    eager_result = eager.fit()
    yield SimpleNamespace(
        trainer=compiled, result=result, record=result.compile, eager=eager,
        eager_result=eager_result,
    )  # fmt: skip
    reset_compiled()


def test_the_compile_step_runs_before_training_and_torch_accounts_for_it(watched):
    record = watched.record
    assert watched.result.label == "bf16+compile:reduce-overhead"
    kinds = [e.kind for e in record.first.entries]
    assert "forward" in kinds
    if record.cache == "miss":  # a cold compile builds the backward at the first backward;
        assert "backward" in kinds  # a cache hit loads it with the forward
    assert record.cache in ("hit", "miss", "partial")  # either is said
    assert record.compile_s is not None and record.torch_compile_s > 0
    assert record.compile_s >= record.torch_compile_s * 0.9
    # no training step pays the compile: torch compiled nothing in the first steps but the one
    # recompilation a new batch shape asks for (tested below), and a cold compile step (seconds)
    # is far longer than any step; a cache hit's is short, so time says nothing there
    assert [where for where, _ in record.recompiles] == ["steps 1-7"]
    if record.cache == "miss":
        assert max(watched.result.step_times_s[:6]) < record.compile_s / 5
    events = [e for e in watched.result.events if e.kind == "compile"]
    assert events and events[0].message.startswith("bf16+compile:reduce-overhead: compile step")
    assert watched.result.to_dict()["compile"]["cache"] == record.cache


def test_a_new_batch_shape_is_one_recompilation_with_torchs_reason(watched):
    (where, reason), *rest = watched.record.recompiles
    assert rest == []
    assert where == "steps 1-7"
    assert "size mismatch" in reason
    assert watched.record.recompile_s > 0
    assert any("1 recompilation(s)" in e.message for e in watched.result.events)


def test_reduce_overhead_on_cpu_records_inductors_cuda_graph_skip(watched):
    record = watched.record
    # Off CUDA inductor counts the skip and logs no reason (on CUDA it logs one).
    assert record.cudagraph_skip_count >= 1 and record.cudagraph_skips == ()
    assert any("CUDA graphs not used" in line and "runs on cpu" in line for line in record.lines())


def test_the_compiled_run_trains_what_the_eager_run_trains(watched):
    compiled = [r["loss"] for r in watched.result.records][:6]
    eager = [r["loss"] for r in watched.eager_result.records]
    result = agreement("bf16+compile", compiled, "bf16", eager, torch.bfloat16)
    assert result.steps == 6
    assert result.agrees, result.message()  # dropout included: the compile step forked the RNG
    shifted = [v * 1.05 for v in eager]  # a 5 % different trajectory
    assert not agreement("x", shifted, "bf16", eager, torch.bfloat16).agrees


def test_a_second_fit_of_the_same_trainer_does_not_compile_again(watched):
    before = watched.record.compile_s
    more = watched.trainer.fit(steps=2)
    assert more.compile.compile_s == before
    assert [e for e in more.events if e.kind == "compile" and "compile step" in e.message] == []


def test_compilations_outside_a_watch_are_not_counted(watched):
    with TorchWatch() as nothing:
        pass
    assert nothing.result.entries == () and nothing.result.cache == "none"


def test_a_failing_compile_step_is_recorded_then_raised():
    log = CompileLog("fp32+compile", pnb.plan("fp32", "cpu").compile)

    def fails() -> None:
        raise RuntimeError("BackendCompilerFailed: simulated")

    with pytest.raises(RuntimeError, match="simulated"):
        log.compile_step(fails)
    assert log.record().failure == "RuntimeError: BackendCompilerFailed: simulated"
    assert log.record().lines() == [
        "fp32+compile: compile failed: RuntimeError: BackendCompilerFailed: simulated"
    ]


def test_torchs_compilation_metrics_keep_the_fields_read_here():
    fields = {f.name for f in dataclasses.fields(_metrics_module().CompilationMetrics)}
    needed = {
        "compile_id", "is_forward", "duration_us", "start_time_us", "recompile_reason",
        "num_graph_breaks", "fail_type", "fail_reason", "co_name",
        "backward_cumulative_compile_time_us", "inductor_fx_local_cache_hit_count",
        "inductor_fx_local_cache_miss_count", "aotautograd_local_cache_hit_count",
        "aotautograd_local_cache_miss_count",
    }  # fmt: skip
    assert needed <= fields


def test_a_dispatch_mode_trace_of_a_compiled_model_sees_eager_ops(watched):
    """Pins what docs/memory-and-ops.md and the inspection caveats say: torch.compile does not
    run under the op tracer's dispatch mode, so a trace of a compiled plan records eager ops."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    x = torch.randn(8, 16)
    traced = []
    for forward in (watched.trainer.forward, watched.eager.model):
        with TorchWatch() as seen, Ops() as ops:
            with autocast_context(watched.trainer.plan):
                forward(x).float().sum().backward()
        traced.append(ops.ops)
        assert seen.result.entries == ()  # and nothing was compiled for the trace
    # Compiled code would show fewer ops (fused kernels are not ATen ops): the same list means
    # the compiled model ran eagerly under the dispatch mode.
    assert "gelu" in traced[1] and traced[0] == traced[1]
    caveats = inspection_caveats(pnb.plan("bf16", "cpu", compile="default").compile, "bf16")
    assert [c.part for c in caveats] == ["ops", "memory"]
    assert DISPATCH_MODE_SKIP in caveats[0].sees and "EAGER bf16 step" in caveats[0].sees
    assert inspection_caveats(pnb.plan("bf16", "cpu").compile, "bf16") == ()
