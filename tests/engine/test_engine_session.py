"""The resumable run API: Trainer.start() -> FitSession.advance(n) ... -> finish(), step times."""

import time

import pytest
import torch
from engine_helpers import quiet

from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine import recorder as step_timer
from precision_nb.engine.trainer import Trainer

LAB = PrecisionConfig(mode="fp16", loss_scale_lab=True)


def run_split(make_model, batches, splits, precision=None, fused=None, **cfg):
    trainer = Trainer(
        make_model(),
        batches,
        device="cpu",
        precision=precision,
        optimizer=OptimizerConfig(fused=fused),
        train=quiet(**cfg),
    )
    session = trainer.start()
    counted = [session.advance(n) for n in splits]
    assert session.done
    result = session.finish()
    params = [p.detach().clone() for p in trainer.model.parameters()]
    return result, params, counted


LAB_CFG = dict(init_scale=256.0, growth_interval=3, overflow_at_steps=(4,), warmup_steps=6)


@pytest.mark.parametrize(
    "precision,extra",
    [
        (None, dict(warmup_steps=3, schedule="cosine")),
        (LAB, LAB_CFG),
        (LAB, dict(LAB_CFG, fused=True)),  # only the device knows the skip
    ],
)
def test_results_do_not_depend_on_how_steps_are_split(make_model, batches, precision, extra):
    cfg = dict(steps=12, log_every=4, grad_clip=1.0, **extra)
    runs = [run_split(make_model, batches, s, precision, **cfg) for s in ([12], [5, 7], [1] * 12)]
    (base, base_params, counted) = runs[0]
    assert counted == [12] and base.steps == 12
    if precision is LAB:
        assert base.skipped_total == 1 and base.attempts == 13
    for result, params, counted in runs[1:]:
        assert sum(counted) == 12
        assert [r["loss"] for r in result.records] == [r["loss"] for r in base.records]
        assert [r["lr"] for r in result.records] == [r["lr"] for r in base.records]
        assert [r["step"] for r in result.records] == [4, 8, 12]
        assert result.scale_history == base.scale_history
        assert all(torch.equal(a, b) for a, b in zip(params, base_params, strict=True))


def test_session_is_live_and_finish_is_final(make_model, batches):
    seen = []

    class Log:
        def on_fit_start(self, result):
            seen.append("start")

        def on_log(self, record):
            seen.append(record["step"])

        def on_fit_end(self, result):
            seen.append("end")

    t = Trainer(make_model(), batches, device="cpu", train=quiet(steps=6, log_every=3))
    session = t.start(callbacks=[Log()])
    assert seen == ["start"] and not session.done and session.result.steps == 0
    assert session.advance(0) == 0 and session.advance(2) == 2 and seen == ["start"]
    assert session.advance(2) == 2 and seen == ["start", 3] and session.result.steps == 4
    assert session.advance(100) == 2 and session.done and session.advance(1) == 0
    result = session.finish()
    assert seen == ["start", 3, 6, "end"] and result is session.result
    assert session.finish() is result and seen.count("end") == 1
    with pytest.raises(ValueError, match="advance.n"):
        t.start().advance(-1)
    early = t.start()
    early.advance(1)
    assert early.finish().stopped and early.result.events[-1].data["reason"].startswith("finished")


def test_stop_ends_the_session_early(make_model, batches):
    class Stop:
        def __init__(self):
            self.flag = False

        def is_set(self):
            return self.flag

    stop = Stop()
    session = Trainer(make_model(), batches, device="cpu", train=quiet(steps=10)).start(stop=stop)
    assert session.advance(3) == 3
    stop.flag = True
    assert session.advance(3) == 0 and session.done
    result = session.finish()
    assert result.stopped and result.steps == 3 and result.events[-1].kind == "stop"


def test_step_times_cover_every_attempt_and_exclude_logging(make_model, batches):
    class SlowLog:
        def on_log(self, record):
            time.sleep(0.3)

    cfg = quiet(steps=6, log_every=2, init_scale=64.0, overflow_at_steps=(3,))
    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=cfg)
    result = t.fit(callbacks=[SlowLog()])
    assert len(result.step_times_s) == len(result.scale_history) == result.attempts == 7
    assert all(0 < s < 0.3 for s in result.step_times_s[1:])  # the first one warms up
    assert result.seconds > 0.9  # three records, each 0.3 s of logging work
    assert all(r["step_time_s"] < 0.3 for r in result.records[1:])


class FakeEvent:
    clock = 0.0

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self):
        FakeEvent.clock += 0.25
        self.t = FakeEvent.clock

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3  # milliseconds, as torch.cuda.Event


def test_cuda_step_times_come_from_events_read_at_logging_points(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    timer = step_timer.StepTimer(torch.device("cuda"))
    for _ in range(3):
        timer.start()
        timer.stop()
    timer.start()  # an attempt that never finished is dropped
    assert timer.collect() == [0.25, 0.25, 0.25] and timer.collect() == []


def test_run_result_shows_a_summary_not_a_dump(make_model, batches):
    result = Trainer(make_model(), batches, device="cpu", train=quiet(steps=4, log_every=2)).fit()
    text = repr(result)
    assert text.startswith("<RunResult fp32: fp32 on cpu, 4 steps") and len(text) < 200
    assert f"final loss {result.final_loss:.4g}" in text
    page = result._repr_html_()
    assert "<code>verify</code>" in page and f"{result.final_loss:.6g}" in page
    assert "<script" not in page and len(page) < 4000
