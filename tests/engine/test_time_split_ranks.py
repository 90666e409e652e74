"""A distributed run's time split without a launch: a rank's split survives its JSON line, the
launcher keeps the slowest rank's, a rank that could not profile is named with its reason, and
the kept splits are reconciled with the distributed verdict's interval; a rank writes its split even
when timing AdamW for the advice fails."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from precision_nb.engine.adamw_timing import AdamWTiming
from precision_nb.engine.comparison import Comparison, PlanOutcome
from precision_nb.engine.time_split import (
    DISTRIBUTED,
    FAMILIES,
    PlanFacts,
    SplitConfig,
    TimeSplit,
    missing,
    rank_split,
    split_distributed,
)
from precision_nb.engine.time_split.profiling import CastSummary, MatmulShape
from precision_nb.engine.time_split.ranks import (
    ELSEWHERE,
    from_json,
    profiled_seconds,
    slowest,
    to_json,
)
from precision_nb.engine.train_config import TrainConfig
from precision_nb.engine.trainer import Trainer


def _split(label: str, seconds: float = 0.5, **families: float) -> TimeSplit:
    fam = {f: families.get(f, 0.0) for f in FAMILIES}
    total = sum(fam.values())
    return TimeSplit(
        label, fam, step_s=total, traced={f: v * 1.1 for f, v in fam.items()},
        traced_s=total * 1.1, profiler_s=total * 0.1, timer_s=total * 1.11, unprofiled_s=total,
        steps=3,
        view="host self time per op (CPU)", device="cpu", seconds=seconds,
        casts=CastSummary(2.0, 1024.0, 1e-4, 1.0, 512.0),
        matmuls=(MatmulShape("addmm", 32, 64, 128, "c10::BFloat16", 2.0, 3e-4),),
        ops={"matmul": (("aten::addmm", 3e-4),), "communication": (("c10d::allreduce_", 1e-4),)},
        notes=("a note",),
    )  # fmt: skip


def _line(split: TimeSplit, facts: PlanFacts | None = None) -> dict:
    """What the launcher reads back: the rank's JSON line, through JSON text."""
    line = {"kind": "time_split", "plan": split.label, **to_json(split, facts)}
    return json.loads(json.dumps(line))


def test_a_rank_s_split_and_facts_survive_its_json_line() -> None:
    split = _split("bf16", matmul=3e-3, communication=1e-3, other=2e-3)
    timing = AdamWTiming("cpu", 2, 100, 5, 10, 3e-3, 1e-4, 1e-3, 1e-4, 3.0, 2.5, 3.5)
    facts = PlanFacts("plain AdamW on float32 weights", "no AVX512-BF16", False, timing)
    assert from_json(_line(split, facts)) == (split, facts)
    gone = missing("bf16", "no profiler")
    assert from_json(_line(gone)) == (gone, None)


def test_the_launcher_keeps_the_slowest_rank_s_split_and_names_every_rank_s_step() -> None:
    fast = _split("bf16", 0.5, matmul=2e-3, communication=3e-3)
    slow = _split("bf16", 0.7, matmul=4e-3, communication=2e-3)
    kept, facts = slowest("bf16", [_line(fast, PlanFacts("a")), _line(slow, PlanFacts("b"))])
    assert kept.families == slow.families and kept.step_s == slow.step_s
    assert facts == PlanFacts("b")
    assert "rank 1's profiled steps, the slowest of the 2 ranks'" in kept.notes[-1]
    assert "rank 0: 5.000 ms, rank 1: 6.000 ms" in kept.notes[-1]
    assert profiled_seconds({"bf16": [_line(fast), _line(slow)], "fp32": [_line(fast), None]}) == (
        pytest.approx(1.0)  # rank 0: 0.5 + 0.5; rank 1: 0.7
    )


def test_a_rank_that_could_not_profile_is_named_with_its_own_reason() -> None:
    ok = _line(_split("bf16", matmul=1e-3))
    follower = _line(missing("bf16", ELSEWHERE))
    busy = _line(missing("bf16", "another profiler is recording in this process"))
    split, facts = slowest("bf16", [ok, follower, busy])
    assert split.missing == "rank 2: another profiler is recording in this process"
    assert facts is None
    split, _ = slowest("bf16", [ok, None])
    assert split.missing.startswith("rank 1 wrote no time split")
    assert not slowest("bf16", [])[0].available


@dataclass
class Speed:
    estimate: float
    low: float | None
    high: float | None


@dataclass
class Timing:
    median: float


def test_a_distributed_comparison_gets_the_kept_splits_reconciled_with_its_verdict() -> None:
    runs = {"fp32": None, "bf16": None}
    comparison = Comparison(results=runs)
    comparison.outcomes = {
        "fp32": PlanOutcome("fp32", timing=Timing(0.009)),
        "bf16": PlanOutcome("bf16", timing=Timing(0.006), speedup=Speed(1.5, 1.4, 1.6)),
    }
    comparison.baseline = "fp32"
    base = _split("fp32", matmul=6e-3, communication=2e-3, other=1e-3)
    plan = _split("bf16", matmul=3e-3, communication=2e-3, other=1e-3)
    per_rank = {
        "fp32": [_line(base, PlanFacts("plain AdamW on float32 weights")), _line(base)],
        "bf16": [_line(plan, PlanFacts("plain AdamW on float32 weights")), _line(plan)],
    }
    events = split_distributed(comparison, per_rank)
    found = comparison.time_split
    bf16 = comparison.outcomes["bf16"]
    assert bf16.time_split is found.splits["bf16"] and bf16.time_split.measured_s == 0.006
    assert bf16.difference.reconstructed == pytest.approx(1.5)
    assert (bf16.difference.low, bf16.difference.high) == (1.4, 1.6) and bf16.difference.agrees
    assert found.seconds == pytest.approx(1.0) and events[0].kind == "measurement"
    rows = [r for r in found.rows() if r["family"] == "communication"]
    assert [r["ms_per_step"] for r in rows] == pytest.approx([2.0, 2.0])

    per_rank["bf16"][1] = _line(missing("bf16", "the profiled steps failed: RuntimeError: x"))
    events = split_distributed(comparison, per_rank)
    gone = comparison.outcomes["bf16"].time_split
    assert gone.missing == f"{DISTRIBUTED}: rank 1: the profiled steps failed: RuntimeError: x"
    assert any(e.kind == "warning" and "bf16" in e.message for e in events)


class Tiny(nn.Module):
    """A linear layer whose loss is its own output's mean: enough for a short fit."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).square().mean()


def _fitted() -> Trainer:
    torch.manual_seed(0)
    batch = torch.randn(8, 64)
    cfg = TrainConfig(steps=2, progress=False, measure_peak=False)
    trainer = Trainer(Tiny(), lambda i: batch, device="cpu", precision="fp32", train=cfg)
    trainer.fit(2)
    return trainer


def test_a_rank_writes_its_split_and_its_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    from precision_nb.engine import time_split

    config = SplitConfig(steps=1, unprofiled=0)
    split, facts = from_json(json.loads(json.dumps(rank_split(_fitted(), "fp32", config))))
    assert split.available and split.steps == 1 and split.step_s > 0
    assert facts is not None and "AdamW on float32 weights" in facts.optimizer

    def fails(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("sharded parameters")

    # a plain AdamW step that holds the whole step wants the fused timing: it fails here, and
    # the split says so instead of losing the rank
    monkeypatch.setattr(time_split, "wants_adamw_timing", lambda *_: True)
    monkeypatch.setattr(time_split, "time_adamw", fails)
    split, facts = from_json(rank_split(_fitted(), "fp32", config))
    assert facts is not None and facts.adamw is None
    assert "no optimizer advice" in split.notes[-1] and "sharded parameters" in split.notes[-1]
