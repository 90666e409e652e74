import math
import threading
import traceback

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import quiet
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.entry import fit
from precision_nb.engine.results import (
    RECORD_KEYS,
    DeviceOutOfMemoryError,
    FitError,
    NonFiniteLossError,
    RunResult,
)
from precision_nb.engine.trainer import TrainConfig, Trainer, lr_factor

LAB = PrecisionConfig(mode="fp16", loss_scale_lab=True)


def test_records_have_the_stable_keys_and_counts(make_model, batches):
    result = Trainer(make_model(), batches, device="cpu", train=quiet(steps=25, log_every=10)).fit()
    assert [r["step"] for r in result.records] == [10, 20, 25]
    assert all(tuple(r) == RECORD_KEYS for r in result.records)
    first = result.records[0]
    assert first["mode"] == "fp32" and first["memory_kind"] == "host_rss"
    assert first["samples_per_s"] == pytest.approx(8 / first["step_time_s"])
    assert first["flops_per_s"] > 0 and first["mfu"] is None  # calibration disabled
    assert result.steps == 25 and not result.stopped and len(result.scale_history) == 25
    assert result.workload["batch_size"] == 8 and result.workload["flops_per_step"] > 0


def test_accumulation_of_half_batches_equals_one_full_batch(make_model, linear_data):
    xs, ys = linear_data
    full = Trainer(make_model(), lambda i: (xs[:16], ys[:16]), device="cpu", train=quiet(steps=3))
    full.fit()
    halves = Trainer(
        make_model(),
        lambda i: (xs[:8], ys[:8]) if i % 2 == 0 else (xs[8:16], ys[8:16]),
        device="cpu",
        train=quiet(steps=3, accumulation=2),
    )
    result = halves.fit()
    assert halves.microbatches_done == 6 and result.steps == 3
    for a, b in zip(full.model.parameters(), halves.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    last = result.records[-1]
    assert last["samples_per_s"] == pytest.approx(16 / last["step_time_s"])


def test_grad_clipping_and_lr_schedule(make_model, batches):
    cfg = quiet(steps=10, log_every=1, grad_clip=0.01, warmup_steps=3, schedule="cosine")
    result = Trainer(make_model(), batches, device="cpu", train=cfg).fit()
    lrs = [r["lr"] for r in result.records]
    assert lrs[:3] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3])
    assert lrs[3] > lrs[-1] >= 1e-4 and lrs == sorted(lrs[:3]) + sorted(lrs[3:], reverse=True)
    assert all(r["grad_norm"] > 0.01 for r in result.records)  # the norm before clipping
    assert lr_factor(99, TrainConfig(schedule="cosine"), 100) == pytest.approx(0.1, abs=1e-3)


def test_stop_flag_keeps_records(make_model, batches):
    stop = threading.Event()

    class StopAfterFirstLog:
        def on_log(self, record):
            stop.set()

    t = Trainer(make_model(), batches, device="cpu", train=quiet(steps=50, log_every=5))
    result = t.fit(callbacks=[StopAfterFirstLog()], stop=stop)
    assert result.stopped and result.steps == 5 and len(result.records) == 1
    assert any(
        e.kind == "stop" and e.data == {"reason": "stopped by request", "steps": 5, "of": 50}
        for e in result.events
    )


def test_keyboard_interrupt_stops_between_steps(make_model, batches):
    calls = {"n": 0}

    def source(i):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return batches(i)

    result = Trainer(make_model(), source, device="cpu", train=quiet(steps=20, log_every=5)).fit()
    assert result.stopped and result.steps == 7  # the 8th batch was never trained on
    assert [r["step"] for r in result.records] == [5, 7]
    assert result.events[-1].kind == "stop" and "interrupted" in result.events[-1].message


def test_callbacks_see_start_logs_end(make_model, batches):
    seen = []

    class Recorder:
        def on_fit_start(self, result):
            seen.append(("start", result.plan.mode))

        def on_log(self, record):
            seen.append(("log", record["step"]))

        def on_fit_end(self, result):
            seen.append(("end", result.steps))

    fit(make_model(), batches, train=quiet(steps=4, log_every=2), callbacks=[Recorder()])
    assert seen == [("start", "fp32"), ("log", 2), ("log", 4), ("end", 4)]


def test_loss_scale_lab_overflow_skips_and_backs_off(make_model, batches):
    cfg = quiet(steps=8, log_every=4, init_scale=256.0, growth_interval=3, overflow_at_steps=(5,))
    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=cfg)
    result = t.fit()
    hist = result.scale_history
    assert result.steps == 8 and result.attempts == 9 and result.skipped_total == 1
    assert [h["skipped"] for h in hist].count(True) == 1
    skip = next(h for h in hist if h["skipped"])
    assert skip["attempt"] == 5
    assert hist[5]["loss_scale"] == skip["loss_scale"] / 2  # backoff by the real scaler
    assert hist[3]["loss_scale"] == 512.0  # growth after 3 good steps
    assert result.records[-1]["step"] == 8 and result.records[-1]["loss_scale_lab"] is True
    assert sum(r["skipped"] for r in result.records) == 1


def test_each_fit_gets_a_fresh_scaler(make_model, batches):
    cfg = quiet(steps=3, init_scale=128.0, overflow_at_steps=(1,))
    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=cfg)
    t.fit()
    first_scaler = t.scaler
    second = t.fit()
    assert t.scaler is not first_scaler and second.scale_history[0]["loss_scale"] == 128.0


def test_overflow_request_without_scaler_is_reported(make_model, batches):
    result = fit(make_model(), batches, train=quiet(steps=2, overflow_at_steps=(1,)))
    assert result.steps == 2 and "ignored" in result.events[0].message


def nan_at(batches, index):
    def source(i):
        x, y = batches(i)
        return (x * float("nan"), y) if i == index else (x, y)

    return source


def test_non_finite_loss_names_the_step_and_keeps_records(batches, make_model):
    with pytest.raises(NonFiniteLossError, match="at step 3") as info:
        Trainer(
            make_model(), nan_at(batches, 2), device="cpu", train=quiet(steps=10, log_every=10)
        ).fit()
    assert info.value.step == 3 and info.value.result.records[-1]["step"] == 2


def test_non_finite_loss_skipped_on_request(batches, make_model):
    cfg = quiet(steps=5, log_every=5, skip_nonfinite=True)
    model = make_model()
    result = Trainer(model, nan_at(batches, 2), device="cpu", train=cfg).fit()
    assert result.steps == 5 and result.attempts == 6 and result.skipped_total == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert math.isfinite(result.final_loss)


def test_out_of_memory_is_reported_with_plan_batch_and_peak(batches):
    class Oom(nn.Linear):
        def forward(self, x):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    with pytest.raises(DeviceOutOfMemoryError, match=r"plan fp32.*batch size 8.*peak") as info:
        Trainer(Oom(8, 2), batches, device="cpu", train=quiet(steps=2)).fit()
    assert info.value.result is not None and "released" in str(info.value)


def test_your_error_reaches_you_as_itself_with_the_result(make_model, batches):
    def source(i):
        if i == 5:
            raise OSError("disk gone")
        return batches(i)

    try:
        Trainer(make_model(), source, device="cpu", train=quiet(steps=10, log_every=2)).fit()
    except OSError as exc:  # the user's own except clause catches it
        error = exc
    assert type(error) is OSError and str(error) == "disk gone"
    assert error.__traceback__ is not None
    *_, last = traceback.extract_tb(error.__traceback__)
    assert last.name == "source" and last.line == 'raise OSError("disk gone")'  # intact
    # microbatch 5 is attempt 6: attempts 1-5 are recorded, the last one in a partial record
    assert isinstance(error.result, RunResult)
    assert [r["step"] for r in error.result.records] == [2, 4, 5]
    assert error.__notes__ == [
        "precision_nb: the partial RunResult recorded so far is `.result` on this exception"
    ]


def test_a_bad_value_found_while_running_stays_a_value_error_with_the_result(make_model, batches):
    def scalar_less(out, y):
        return F.cross_entropy(out, y, reduction="none")  # one loss per sample: not a scalar

    with pytest.raises(ValueError, match="expected a scalar") as info:
        fit(make_model(), batches, device="cpu", loss_fn=scalar_less, train=quiet(steps=2))
    assert type(info.value) is ValueError and isinstance(info.value.result, RunResult)
    assert not isinstance(info.value, FitError) and info.value.__cause__ is None


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(steps=0), "train.steps"),
        (dict(accumulation=-1), "train.accumulation"),
        (dict(log_every=True), "train.log_every"),
        (dict(grad_clip=0), "train.grad_clip"),
        (dict(schedule="linear"), "train.schedule"),
        (dict(overflow_at_steps=(0,)), "overflow_at_steps"),
    ],
)
def test_bad_train_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_bad_models_and_sources(batches):
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        Trainer(frozen, batches, device="cpu")
    with pytest.raises(ValueError, match="torch.nn.Module"):
        Trainer("model", batches, device="cpu")
    with pytest.raises(ValueError, match="batches has type int"):
        Trainer(nn.Linear(8, 2), 5, device="cpu")
    with pytest.raises(ValueError, match="empty"):
        Trainer(nn.Linear(8, 2), [], device="cpu").fit()
    with pytest.raises(ValueError, match="TrainConfig fields"):
        fit(nn.Linear(8, 2), batches, stepz=3)


def test_bring_your_own_dataloader_mapping_and_generator():
    ds = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    result = fit(nn.Linear(8, 2), DataLoader(ds, batch_size=8), train=quiet(steps=6, log_every=3))
    assert result.steps == 6  # cycles through 4 batches per epoch

    class Dict(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 2)

        def forward(self, features):
            return {"logits": self.lin(features)}

    maps = [{"features": torch.randn(4, 8), "labels": torch.tensor([0, 1, 0, 1])}] * 3
    assert fit(Dict(), maps, train=quiet(steps=2)).steps == 2
    gen = ((torch.randn(4, 8), torch.tensor([0, 1, 1, 0])) for _ in range(3))
    short = fit(nn.Linear(8, 2), gen, train=quiet(steps=10, log_every=10))
    assert short.stopped and short.steps == 3 and "ran out" in short.events[-1].data["reason"]


@pytest.mark.parametrize("name", ["mlp", "transformer", "cnn"])
def test_builtin_workloads_train_and_learn(name):
    result = fit(name, train=quiet(steps=20, log_every=10), optimizer=None)
    assert result.steps == 20 and result.workload["name"] in ("mlp", "transformer", "cnn")
    assert result.records[-1]["loss"] < result.records[0]["loss"] * 1.05
    if name == "transformer":
        assert result.records[-1]["tokens_per_s"] > 0
    else:
        assert result.records[-1]["tokens_per_s"] is None


def test_bf16_on_cpu_autocasts():
    result = fit("mlp", precision="bf16", train=quiet(steps=3))
    rec = result.records[-1]
    assert rec["mode"] == "bf16" and rec["autocast_enabled"] and rec["dtype"] == "torch.bfloat16"


def test_overflow_attempts_count_from_each_fit(make_model, batches):
    cfg = quiet(steps=3, init_scale=64.0, overflow_at_steps=(2,))
    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=cfg)
    t.fit()
    second = t.fit()
    assert [h["attempt"] for h in second.scale_history if h["skipped"]] == [6]  # 4 + 2


def test_mfu_above_one_is_reported_not_clipped(make_model, batches, monkeypatch):
    from precision_nb.engine import run_setup
    from precision_nb.engine.metrics import Peak

    monkeypatch.setattr(run_setup, "peak_flops", lambda *a, **k: Peak(1.0, "measured: tiny"))
    result = Trainer(make_model(), batches, device="cpu", train=quiet(steps=4, log_every=2)).fit()
    assert result.records[0]["mfu"] > 1
    assert sum(e.kind == "calibration" and "> 1" in e.message for e in result.events) == 1
