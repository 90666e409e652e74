"""Panel failures, headless: a failing run, comparison, figure or model is shown in the panel
(status and error box), which stays usable; bad seeds are refused where they are set."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from precision_nb.views.panel import Panel
from precision_nb.views.panel.run import describe_failure, is_out_of_memory

PNG = b"\x89PNG\r\n\x1a\n"
TIMEOUT = 120


def _batches() -> list:
    return [(torch.randn(3, 4), torch.randint(0, 2, (3,)))]


def test_failed_run_is_shown_in_the_panel_which_stays_usable() -> None:
    model = nn.Linear(4, 2)
    bad = [(torch.randn(3, 5), torch.randint(0, 2, (3,)))]  # 5 features for a 4-input model
    panel = Panel(model, bad, steps=2)
    panel.widgets.run_button.click()  # a click never raises
    assert panel.wait(TIMEOUT)
    assert panel.error is not None and panel.error.startswith("Run failed")
    assert "mat1 and mat2" in panel.error  # torch's own words about the shapes
    assert "Traceback" not in panel.widgets.error_box.value
    assert panel.widgets.error_box.layout.display != "none"
    assert panel.widgets.progress.bar_style == "danger"
    assert not panel.widgets.run_button.disabled and panel.widgets.stop_button.disabled
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        panel.run(block=True)
    # still usable: the plan keeps resolving
    panel.set(mode="bf16")
    assert panel.plan.mode == "bf16"


class _NoAutocastModel(nn.Module):
    """Trains in fp32, fails under autocast (a custom op without a bf16 kernel, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("custom_op has no kernel for BFloat16")
        return self.linear(x)


def test_failed_comparison_keeps_the_records_of_finished_plans() -> None:
    batches = [(torch.randn(3, 4), torch.randint(0, 2, (3,)))]
    panel = Panel(_NoAutocastModel(), batches, steps=3, log_every=1, compare_plans=("fp32", "bf16"))
    panel.widgets.compare_button.click()
    assert panel.wait(TIMEOUT)
    expected = "Run failed (RuntimeError): plan bf16: custom_op has no kernel for BFloat16"
    assert panel.error == expected
    assert type(panel.last_exception) is RuntimeError  # the model's own error, not a wrapper
    assert panel.result is panel.last_exception.result  # the comparison rides on it
    assert set(panel.result.failures) == {"bf16"}
    frame = panel.records_frame
    assert set(frame["run"]) == {"fp32"} and len(frame) == 3
    assert "Failed" in panel.widgets.status.value
    assert panel.draw_figure().startswith(PNG)
    assert not panel.widgets.compare_button.disabled


class _OutOfMemoryModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def test_out_of_memory_says_what_to_change() -> None:
    batches = [(torch.randn(3, 4), torch.randint(0, 2, (3,)))]
    panel = Panel(_OutOfMemoryModel(), batches, steps=2)
    panel.widgets.run_button.click()
    assert panel.wait(TIMEOUT)
    assert panel.error is not None and panel.error.startswith("Out of memory")
    assert "smaller preset or batch" in panel.error and "accumulation" in panel.error
    assert not panel.widgets.run_button.disabled


def test_describe_failure_gives_advice_for_raw_torch_oom() -> None:
    message = describe_failure(torch.OutOfMemoryError("CUDA out of memory"), batch_hint="now large")
    assert message.startswith("Out of memory") and "(now large)" in message
    assert "accumulation" in message and "mixed-precision" in message
    assert describe_failure(ValueError("steps bad")) == "Run failed (ValueError): steps bad"


def test_a_failing_figure_never_loses_the_run(monkeypatch) -> None:
    from precision_nb.views.report import figures

    def broken(*_args, **_kwargs):
        raise ValueError("figure exploded")

    monkeypatch.setattr(figures, "draw_loss", broken)
    model = nn.Linear(4, 2)
    batches = [(torch.randn(3, 4), torch.randint(0, 2, (3,)))]
    panel = Panel(model, batches, steps=3, log_every=1)
    result = panel.run(block=True)
    panel.widgets.figure_button.click()  # a click never raises
    assert result.steps == 3 and len(panel.records_frame) == 3
    assert panel.error == "Draw figure failed: ValueError: figure exploded"
    assert not panel.widgets.run_button.disabled and not panel.widgets.figure_button.disabled
    # the same when frames seem free, so the panel draws them during and after the run
    panel._controller.session.frame_cost_s = 1e-9
    again = panel.run(block=True)
    assert again.steps == 3 and len(panel.records_frame) == 3
    assert "figure exploded" in panel.error and not panel.widgets.run_button.disabled


class _ExitingModel(nn.Module):
    """A forward that raises a BaseException, as a model calling sys.exit() would."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.error = error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.error


class _CustomBaseError(BaseException):
    """Not an Exception: what a careless library might raise."""


@pytest.mark.parametrize("error", [SystemExit(3), _CustomBaseError("bad")])
def test_a_base_exception_in_forward_is_shown_not_swallowed(error: BaseException) -> None:
    panel = Panel(_ExitingModel(error), _batches(), steps=2)
    panel.widgets.run_button.click()
    assert panel.wait(TIMEOUT)
    name = type(error).__name__
    assert panel.error is not None and panel.error.startswith(f"Run failed ({name})")
    assert (
        name in panel.widgets.error_box.value and panel.widgets.error_box.layout.display != "none"
    )
    assert "Failed before the first logged step" in panel.widgets.status.value
    assert panel.widgets.progress.bar_style == "danger"
    assert isinstance(panel.last_exception, type(error))
    assert not panel.widgets.run_button.disabled and not panel.running
    with pytest.raises(type(error)):
        panel.run(block=True, timeout=TIMEOUT)


def test_out_of_range_seed_is_refused_by_set_and_constructor() -> None:
    panel = Panel(steps=2)
    for seed in (2**70, 2**64, -(2**63) - 1, 1.5, "x", True):
        with pytest.raises(ValueError, match=r"seed: invalid value"):
            panel.set(seed=seed)
        assert panel.error is not None and "seed" in panel.error
        assert panel.selection.seed == 0  # nothing changed
    panel.set(seed=2**64 - 1)  # the largest seed torch.manual_seed takes
    assert panel.error is None and panel.selection.seed == 2**64 - 1
    with pytest.raises(ValueError, match=r"seed: invalid value"):
        Panel(seed=2**70)


def test_out_of_range_seed_typed_into_the_widget_disables_run_and_says_why() -> None:
    panel = Panel(steps=2)
    panel.widgets.seed.value = 2**70  # as typed into the Seed box
    assert panel.error is not None and "seed: invalid value" in panel.error
    assert (
        "seed" in panel.widgets.error_box.value and panel.widgets.error_box.layout.display != "none"
    )
    assert (
        panel.widgets.run_button.disabled and "cannot be resolved" in panel.widgets.run_reason.value
    )
    panel.widgets.run_button.click()  # a click never raises, and starts nothing
    assert not panel.running and panel.result is None
    with pytest.raises(ValueError, match="seed: invalid value"):
        panel.run()
    panel.widgets.seed.value = 7
    assert panel.error is None and not panel.widgets.run_button.disabled


def test_oom_is_recognised_by_type_and_event_kind_not_by_text() -> None:
    from precision_nb.core.events import Event
    from precision_nb.engine.results import FitError

    assert not is_out_of_memory(RuntimeError("CUDA out of memory"))  # words alone are not enough
    assert is_out_of_memory(torch.OutOfMemoryError("anything"))
    failure = FitError("stopped", result=None)
    assert not is_out_of_memory(failure)
    failure.result = type("Partial", (), {"events": [Event("oom", "x", {"peak_bytes": 1})]})()
    assert is_out_of_memory(failure)
    assert describe_failure(failure).startswith("Out of memory: stopped")
