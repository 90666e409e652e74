"""A real inductor compile, watched: the first step's compile, torch's accounting and cache
outcome, a recompilation with its reason, the CUDA-graph skip on CPU, and a compiled run that
trains what the eager run trains.

Compiling costs seconds even for a tiny model (a minute on a busy 2-core machine), so ONE
module-scoped run compiles once and recompiles once; every test reads it.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import precision_nb as pnb
from precision_nb.core.amp import autocast_context
from precision_nb.engine.compile.agreement import agreement
from precision_nb.engine.compile.record import CompileLog, compile_model, reset_compiled
from precision_nb.engine.compile.torch_state import TorchWatch, _metrics_module
from precision_nb.engine.compile.visibility import DISPATCH_MODE_SKIP, inspection_caveats


class StepSession:
    """The smallest session (``advance``/``result.step_times_s``): one AdamW step per batch."""

    def __init__(self, model: nn.Module, forward: nn.Module, batches, plan) -> None:
        self.model, self.forward, self.batches, self.plan = model, forward, batches, plan
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        self.result = SimpleNamespace(step_times_s=[], losses=[])
        self.done = False

    def advance(self, n: int) -> int:
        for _ in range(n):
            x, y = self.batches[len(self.result.losses)]
            start = time.perf_counter()
            with autocast_context(self.plan):
                out = self.forward(x)
            loss = nn.functional.cross_entropy(out.float(), y)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.result.step_times_s.append(time.perf_counter() - start)
            self.result.losses.append(float(loss))
        return n

    def finish(self):
        return self.result


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


@pytest.fixture(scope="module")
def watched():
    reset_compiled()
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen))
               for _ in range(6)]  # fmt: skip
    batches.append((torch.randn(5, 16, generator=gen), torch.randint(0, 4, (5,), generator=gen)))
    explanation = pnb.plan("bf16", "cpu", compile="reduce-overhead")
    plan = explanation.plan
    log = CompileLog(explanation.label, explanation.compile)
    initial = tiny()
    warm_model = copy.deepcopy(initial)
    warm = log.watch(StepSession(warm_model, compile_model(warm_model, explanation.compile),
                                 batches, plan), "warm-up")  # fmt: skip
    warm.advance(1)
    warm.advance(2)
    run_model = copy.deepcopy(initial)
    compiled = compile_model(run_model, explanation.compile)
    run = log.watch(StepSession(run_model, compiled, batches, plan), "measured")
    run.advance(6)  # a measured copy reuses the compiled code: nothing compiles here
    run.advance(1)  # a batch of 5 samples: a new shape, a recompilation
    eager_model = copy.deepcopy(initial)
    eager = StepSession(eager_model, eager_model, batches, plan)
    eager.advance(6)
    yield SimpleNamespace(
        log=log, record=log.record(steady_step_s=min(run.result.step_times_s[1:6])),
        run=run.result, eager=eager.result, plan=plan, compiled=compiled, eager_model=eager_model,
    )  # fmt: skip
    reset_compiled()


def test_the_first_step_holds_the_compile_torch_accounts_for(watched):
    record = watched.record
    kinds = [e.kind for e in record.first.entries]
    assert "forward" in kinds
    if record.cache == "miss":  # a cold compile builds the backward at the first backward;
        assert "backward" in kinds  # a cache hit loads it with the forward
    assert record.torch_compile_s > 0
    assert record.first_step_s is not None and record.first_step_s > record.steady_step_s
    assert record.compile_s == pytest.approx(record.first_step_s - record.steady_step_s)
    # A first run compiles cold, a rerun may hit inductor's on-disk cache: either is said.
    assert record.cache in ("hit", "miss", "partial")
    assert record.cache_text() in record.lines()[0]


def test_a_new_batch_shape_is_one_recompilation_with_torchs_reason(watched):
    (where, reason), *rest = watched.record.recompiles
    assert rest == []
    assert where == "measured step 7"
    assert "size mismatch" in reason
    assert watched.record.recompile_s > 0
    assert any("1 recompilation(s)" in line for line in watched.record.lines())


def test_reduce_overhead_on_cpu_records_inductors_cuda_graph_skip(watched):
    record = watched.record
    # Off CUDA inductor counts the skip and logs no reason (on CUDA it logs one).
    assert record.cudagraph_skip_count >= 1 and record.cudagraph_skips == ()
    assert any("CUDA graphs not used" in line and "runs on cpu" in line for line in record.lines())


def test_the_compiled_run_trains_what_the_eager_run_trains(watched):
    result = agreement(
        "bf16+compile", watched.run.losses[:6], "bf16", watched.eager.losses, torch.bfloat16
    )
    assert result.steps == 6
    assert result.agrees, result.message()
    shifted = [v * 1.05 for v in watched.eager.losses]  # a 5 % different trajectory
    assert not agreement("x", shifted, "bf16", watched.eager.losses, torch.bfloat16).agrees


def test_compilations_outside_a_watch_are_not_counted(watched):
    with TorchWatch() as nothing:
        pass
    assert nothing.result.entries == () and nothing.result.cache == "none"


def test_a_failing_session_is_recorded_then_raised():
    class Failing:
        result = SimpleNamespace(step_times_s=[])

        def advance(self, n: int) -> int:
            raise RuntimeError("BackendCompilerFailed: simulated")

    log = CompileLog("fp32+compile", pnb.plan("fp32", "cpu").compile)
    with pytest.raises(RuntimeError, match="simulated"):
        log.watch(Failing()).advance(1)
    assert log.record().failure == "RuntimeError: BackendCompilerFailed: simulated"


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
    for forward in (watched.compiled, watched.eager_model):
        with TorchWatch() as seen, Ops() as ops:
            with autocast_context(watched.plan):
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
