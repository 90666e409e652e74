"""One run request for every public entry, callbacks through one dispatcher, and a session that
changes no trainer field (only the counters it is handed)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from engine_helpers import quiet

from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.callbacks import Callback, Callbacks, ProgressBar
from precision_nb.engine.compare import compare
from precision_nb.engine.distributed.launcher import write_spec
from precision_nb.engine.entry import fit
from precision_nb.engine.request import RunRequest
from precision_nb.engine.results import RunResult
from precision_nb.engine.trainer import TrainConfig, Trainer


def test_a_request_is_checked_once_and_frozen():
    request = RunRequest.of("mlp", precision="bf16", train=TrainConfig(steps=3), log_every=1)
    assert request.precisions == (PrecisionConfig("bf16"),) and request.precision.mode == "bf16"
    assert request.train == TrainConfig(steps=3, log_every=1)
    assert request.optimizer == OptimizerConfig() and request.device == "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.preset = "small"  # type: ignore[misc]
    several = RunRequest.of("mlp", precision=["fp32", PrecisionConfig("bf16")])
    assert [p.mode for p in several.precisions] == ["fp32", "bf16"]
    with pytest.raises(ValueError, match="precision: 2 requests given; a single run takes one"):
        several.precision  # noqa: B018
    model, batches, info = RunRequest.of("mlp", device="cpu").prepare()
    assert info["name"] == "mlp" and callable(batches) and sum(1 for _ in model.parameters())


BAD = [
    (
        dict(optimizer="adam"),
        r"optimizer: invalid value 'adam' \(str\); allowed: an OptimizerConfig",
    ),
    (dict(precision=3), r"precision: invalid value 3 \(int\)"),
    (dict(steps_per_round=2), r"unknown train option\(s\) 'steps_per_round'"),
    (dict(loss_fn=42), r"loss_fn: invalid value 42 \(int\)"),
]


@pytest.mark.parametrize("kwargs,message", BAD)
def test_every_entry_refuses_a_bad_argument_with_the_same_message(kwargs, message, tmp_path):
    calls = {
        "fit": lambda: fit("mlp", device="cpu", **kwargs),
        "write_spec": lambda: write_spec("mlp", device="cpu", run_dir=tmp_path, **kwargs),
    }
    if "precision" not in kwargs:  # compare takes its precisions as modes
        calls["compare"] = lambda: compare(["fp32"], device="cpu", **kwargs)
    for name, call in calls.items():
        with pytest.raises(ValueError, match=message):
            call()
        assert not list(tmp_path.iterdir()), name  # refused before anything was written


class OnlyLogs:
    """A plain object with one hook: the dispatcher adapts it."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_log(self, record: dict) -> None:
        self.steps.append(record["step"])


class Counting(Callback):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_fit_start(self, result: RunResult) -> None:
        self.seen.append("start")

    def on_fit_end(self, result: RunResult) -> None:
        self.seen.append(f"end {result.steps}")


def test_callbacks_plain_or_subclassed_get_the_hooks_they_have(make_model, batches):
    plain, sub = OnlyLogs(), Counting()
    result = fit(make_model(), batches, device="cpu", train=quiet(steps=4, log_every=2),
                 callbacks=[plain, sub])  # fmt: skip
    assert plain.steps == [2, 4] and sub.seen == ["start", "end 4"]
    assert result.steps == 4
    assert Callbacks([plain]).wants("on_log") and not Callbacks([plain]).wants("on_fit_end")
    with pytest.raises(ValueError, match="callbacks: invalid value 'on_log'"):
        fit(make_model(), batches, device="cpu", callbacks="on_log")


def test_the_progress_bar_is_a_callback_that_follows_the_records(make_model, batches):
    bar = ProgressBar(total=6, steps_done=4)
    result = RunResult("fp32", None, None, None, "cpu")
    bar.on_fit_start(result)
    bar.on_log({"step": 7})
    assert bar.bar.n == 3 and bar.bar.total == 6
    bar.on_fit_end(result)
    assert bar.bar is None
    session = Trainer(make_model(), batches, device="cpu", train=quiet(steps=3, progress=True))
    started = session.start()
    assert started.progress is not None and started.progress.bar is not None  # shown from start
    started.advance(3)
    started.finish()
    assert started.progress.bar is None  # closed at the end


def test_a_fit_changes_no_trainer_field_from_outside_the_trainer(make_model, batches, monkeypatch):
    writers: list[tuple[str, str]] = []
    plain_setattr = object.__setattr__

    def recording(self, name, value):
        module = sys._getframe(1).f_globals.get("__name__", "")
        if module != "precision_nb.engine.trainer":
            writers.append((module, name))
        plain_setattr(self, name, value)

    t = Trainer(make_model(), batches, device="cpu", train=quiet(steps=4, log_every=2))
    monkeypatch.setattr(Trainer, "__setattr__", recording)
    t.fit()
    t.fit(steps=2)
    assert writers == [] and t.steps_done == 6 and t.attempts_done == 6
