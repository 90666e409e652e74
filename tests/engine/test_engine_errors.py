"""Errors keep the user's type: what your model, batches, loss or callback raises reaches you as
itself, with the partial result on it as ``.result`` (and a note saying so); the product's own
failures stay ``FitError`` subclasses."""

from __future__ import annotations

import dataclasses
import math

import pytest
from engine_helpers import quiet

from precision_nb.engine.entry import fit
from precision_nb.engine.results import (
    FitError,
    NonFiniteLossError,
    RunResult,
    attach_result,
    partial_result,
)


class DiskGone(Exception):
    """An error of the user's own type."""


def _failing_at(batches, index, error):
    def source(i):
        if i == index:
            raise error
        return batches(i)

    return source


def test_an_error_of_your_own_type_is_caught_by_your_except(make_model, batches):
    source = _failing_at(batches, 3, DiskGone("shard 7 missing"))
    with pytest.raises(DiskGone, match="shard 7 missing") as info:
        fit(make_model(), source, device="cpu", train=quiet(steps=10, log_every=1))
    assert type(info.value) is DiskGone
    result = partial_result(info.value)
    assert result is info.value.result and isinstance(result, RunResult)
    assert [r["step"] for r in result.records] == [1, 2, 3]  # three steps trained before it


def test_ctrl_c_before_the_first_step_carries_an_empty_result(make_model, batches):
    source = _failing_at(batches, 0, KeyboardInterrupt())  # the first batch, read at set-up
    with pytest.raises(KeyboardInterrupt) as info:
        fit(make_model(), source, device="cpu", train=quiet(steps=10))
    result = info.value.result
    assert isinstance(result, RunResult) and result.records == [] and result.steps == 0
    assert "RunResult" in info.value.__notes__[0]


def test_ctrl_c_between_steps_still_stops_the_run_and_returns_it(make_model, batches):
    source = _failing_at(batches, 4, KeyboardInterrupt())
    result = fit(make_model(), source, device="cpu", train=quiet(steps=10, log_every=1))
    assert result.stopped and result.steps == 4


def test_a_callbacks_error_at_the_end_carries_the_whole_result(make_model, batches):
    class Broken:
        def on_fit_end(self, result):
            raise LookupError("no dashboard")

    with pytest.raises(LookupError, match="no dashboard") as info:
        fit(make_model(), batches, device="cpu", train=quiet(steps=3), callbacks=[Broken()])
    assert info.value.result.steps == 3 and not info.value.result.stopped


def test_the_products_own_failure_stays_a_fit_error(make_model, batches):
    def nan_loss(out, y):
        return out.sum() * math.nan

    with pytest.raises(NonFiniteLossError) as info:
        fit(make_model(), batches, device="cpu", loss_fn=nan_loss, train=quiet(steps=3))
    assert isinstance(info.value, FitError) and isinstance(info.value.result, RunResult)
    assert partial_result(info.value) is info.value.result


def test_an_exception_with_a_result_of_its_own_keeps_it_and_says_so():
    class WithResult(Exception):
        def __init__(self) -> None:
            super().__init__("http 500")
            self.result = "the server's answer"

    exc = attach_result(WithResult(), RunResult("fp32", None, None, None, "cpu"))
    assert exc.result == "the server's answer" and partial_result(exc) is None
    (note,) = exc.__notes__
    assert "has a `.result` of its own" in note and "not attached" in note


def test_a_frozen_exception_carries_the_result_too():
    @dataclasses.dataclass(frozen=True)
    class Frozen(Exception):
        code: int

    exc = Frozen(3)
    first = RunResult("bf16", None, None, None, "cpu")
    assert attach_result(exc, first) is exc and exc.result is first
    assert "RunResult" in exc.__notes__[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        exc.code = 4  # still frozen for everything else


def test_a_later_attach_replaces_the_result_and_its_note_only():
    exc = DiskGone("x")
    exc.__notes__ = ["the user's own note"]  # what add_note leaves (Python 3.11+)
    attach_result(exc, RunResult("bf16", None, None, None, "cpu"))
    attach_result(exc, ["a comparison"], "plan bf16 failed; ")
    assert exc.result == ["a comparison"]
    assert exc.__notes__ == [
        "the user's own note",
        "precision_nb: plan bf16 failed; the partial list recorded so far is `.result` on this "
        "exception",
    ]


def test_an_error_nobody_attached_to_has_no_partial_result():
    assert partial_result(OSError("x")) is None and partial_result(None) is None
    plain = OSError("x")
    plain.result = 1  # set by someone else, without precision_nb's note
    assert partial_result(plain) is None
