"""The panel's Distributed section without launching anything: which fields each strategy
enables, the live distributed plan with its reasons, every refused request shown in the error
box with the library's message and Run blocked (nothing launched), Compare's message, the code."""

from __future__ import annotations

import ast
import html
from pathlib import Path

import pytest
from torch import nn

import precision_nb as pnb
from precision_nb.core.distributed import Distributed, explain_distributed
from precision_nb.engine.distributed import launcher
from precision_nb.views.panel import Panel
from precision_nb.views.panel.layout import TABS

ENGINE_TESTS = Path(__file__).resolve().parents[2] / "engine" / "distributed"


@pytest.fixture(autouse=True)
def _no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any launch in this module is a failure: refused requests must stop before torchrun."""

    def launched(*_args, **_kwargs):
        raise AssertionError("torchrun was launched")

    monkeypatch.setattr(launcher, "_launch", launched)


@pytest.fixture(scope="module")
def panel() -> Panel:
    return Panel(steps=5)


@pytest.fixture(autouse=True)
def _reset(panel: Panel) -> None:
    panel.set(device="cpu", mode="auto", dtype=None, workload="mlp", preset="tiny")
    panel.set(distributed=None)
    assert panel.error is None


def _enabled(panel: Panel) -> dict[str, bool]:
    c = panel.widgets
    names = ("nproc", "backend", "comm_hook", "param_dtype", "reduce_dtype", "output_dtype")
    return {name: not getattr(c, name).disabled for name in names}


def _library_error(make) -> str:
    with pytest.raises((ValueError, RuntimeError)) as info:
        make()
    return str(info.value)


def _assert_blocked(panel: Panel, message: str) -> None:
    assert panel.error is not None and message in panel.error
    assert panel.widgets.error_box.layout.display != "none"
    assert message in html.unescape(panel.widgets.run_reason.value)
    assert panel.widgets.run_button.disabled
    panel.widgets.run_button.click()  # a click on a blocked panel starts nothing
    assert panel._controller.session.job is None or not panel.running
    with pytest.raises((ValueError, RuntimeError), match="Run is disabled"):
        panel.run()
    assert not panel.running


def test_each_strategy_enables_only_its_fields_and_says_why(panel: Panel) -> None:
    assert not any(_enabled(panel).values())
    assert "trains in this process" in panel.widgets.dist_note.value
    assert panel.distributed is None and panel.distributed_plan is None

    panel.widgets.strategy.value = "ddp"
    assert _enabled(panel) == {
        "nproc": True, "backend": True, "comm_hook": True,
        "param_dtype": False, "reduce_dtype": False, "output_dtype": False,
    }  # fmt: skip
    assert "DDP does not use them" in html.unescape(panel.widgets.dist_note.value)

    panel.widgets.strategy.value = "fsdp2"
    assert _enabled(panel) == {
        "nproc": True, "backend": True, "comm_hook": False,
        "param_dtype": True, "reduce_dtype": True, "output_dtype": True,
    }  # fmt: skip
    assert "FSDP2 sets reduce_dtype" in panel.widgets.dist_note.value
    assert "fsdp2 x2" in panel.widgets.tabs.titles[TABS.index("Distributed")]
    assert panel.distributed == Distributed("fsdp2", 2)


def test_live_plan_shows_every_distributed_field_with_its_reason(panel: Panel) -> None:
    panel.set(mode="bf16", strategy="fsdp2", nproc=2, reduce_dtype="bf16")
    expected = explain_distributed(
        Distributed("fsdp2", 2, reduce_dtype="bf16"), panel.explanation.config, "cpu"
    )
    assert panel.distributed_plan.decisions == expected.decisions
    shown = html.unescape(panel.widgets.plan_html.value)
    assert expected.summary() in shown
    for decision in expected.decisions:
        assert decision.field in shown and decision.reason in shown, decision.field
    # the single-device explanation stays below it
    assert panel.explanation.summary() in shown
    assert panel.error is None and not panel.widgets.run_button.disabled


def test_a_distributed_request_round_trips_through_the_constructor_and_set() -> None:
    request = Distributed("ddp", 2, comm_hook="fp16", backend="gloo", timeout_s=90)
    p = Panel(steps=3, distributed=request)
    try:
        assert p.distributed == request  # fields without a widget (timeout_s) kept
        assert p.widgets.comm_hook.value == "fp16"
        p.set(distributed=None)
        assert p.distributed is None and p.widgets.strategy.value == "none"
    finally:
        p.close()


@pytest.mark.parametrize(
    "case",
    ["nproc 0", "comm hook with fsdp2", "fsdp2 dtype with ddp", "nccl without cuda", "batch"],
)
def test_a_refused_request_typed_into_the_widgets_is_shown_and_blocks_run(
    panel: Panel, case: str
) -> None:
    c = panel.widgets
    c.strategy.value = "ddp"
    if case == "nproc 0":
        c.nproc.value = 0
        message = _library_error(lambda: Distributed("ddp", 0))
    elif case == "comm hook with fsdp2":
        c.comm_hook.value = "bf16"
        c.strategy.value = "fsdp2"
        message = _library_error(lambda: Distributed("fsdp2", 2, comm_hook="bf16"))
        assert not c.comm_hook.disabled  # still enabled, so the refused value can be cleared
    elif case == "fsdp2 dtype with ddp":
        c.strategy.value = "fsdp2"
        c.param_dtype.value = "bf16"
        c.strategy.value = "ddp"
        message = _library_error(lambda: Distributed("ddp", 2, param_dtype="bf16"))
        assert not c.param_dtype.disabled
    elif case == "nccl without cuda":
        c.backend.value = "nccl"
        request = Distributed("ddp", 2, backend="nccl")
        message = _library_error(lambda: explain_distributed(request, None, "cpu"))
    else:
        c.nproc.value = 3  # mlp/tiny: 32 samples per global batch
        from precision_nb.engine.distributed.parallel import check_divisible
        from precision_nb.engine.workloads import get_workload

        samples = get_workload("mlp", "tiny").info["batch_size"]
        assert samples % 3
        message = _library_error(
            lambda: check_divisible(samples, 3, "workload 'mlp' at preset 'tiny'")
        )
    _assert_blocked(panel, message)
    # correcting the value clears the message and enables Run again
    panel.set(distributed=Distributed("ddp", 2))
    assert panel.error is None and not panel.widgets.run_button.disabled


def test_mps_is_refused_in_the_panel(fake_torch) -> None:
    fake_torch(mps=True)
    p = Panel(steps=3, device="mps")
    try:
        assert p.error is None
        p.set(strategy="ddp")
        request = Distributed("ddp", 2)
        message = _library_error(lambda: explain_distributed(request, None, "mps"))
        assert "no torch.distributed backend" in message
        _assert_blocked(p, message)
    finally:
        p.close()


def test_a_model_object_without_a_factory_is_refused_before_any_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ENGINE_TESTS))
    import dist_helpers

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    p = Panel(model, "dist_helpers:batches", steps=3, distributed=Distributed("ddp", 2))
    try:
        _assert_blocked(p, "Sequential given without factory")
        assert "cannot be sent to torchrun workers" in p.error
        # batches given as an object cannot reach the workers either: refused, field named
        q = Panel(model, [dist_helpers.batches()(0)], factory="dist_helpers:plain", steps=3)
        q.set(strategy="ddp")
        _assert_blocked(q, "batches: a list cannot reach torchrun workers")
        q.close()
        # single-process runs of the same panel are not affected
        p.set(strategy="none")
        assert p.error is None and not p.widgets.run_button.disabled
    finally:
        p.close()


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"nproc": 0}, "distributed.nproc"),
        ({"strategy": "fsdp2", "comm_hook": "bf16"}, "distributed.comm_hook"),
        ({"strategy": "ddp", "reduce_dtype": "bf16"}, "distributed.reduce_dtype"),
        ({"strategy": "pipeline"}, "distributed.strategy"),
        ({"distributed": 42}, "distributed"),
        ({"nprocs": 2}, "not a panel control"),
    ],
)
def test_set_refuses_a_bad_value_names_the_field_and_changes_nothing(
    panel: Panel, values: dict, field: str
) -> None:
    panel.set(strategy="ddp", nproc=2)
    with pytest.raises(ValueError, match="allowed") as info:
        panel.set(**values)
    assert field in str(info.value)
    assert panel.error == str(info.value)
    assert panel.distributed == Distributed("ddp", 2)


def test_compare_with_a_strategy_points_to_the_distributed_profile(panel: Panel) -> None:
    panel.set(strategy="ddp")
    assert panel.widgets.compare_button.disabled and not panel.widgets.run_button.disabled
    assert "pnb.profile(" in panel.widgets.run_reason.value
    with pytest.raises(RuntimeError, match="comparisons run on one process"):
        panel.compare()
    assert "profile(" in panel.error
    panel.set(strategy="none")
    assert not panel.widgets.compare_button.disabled


def test_code_view_is_the_equivalent_fit_call(panel: Panel) -> None:
    assert "precision_nb" not in panel.code  # no strategy: the plain PyTorch loop
    panel.set(mode="bf16", steps=7, strategy="ddp", nproc=2, comm_hook="bf16")
    tree = ast.parse(panel.code)
    calls = [
        n for n in ast.walk(tree)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "pnb.fit"
    ]  # fmt: skip
    assert len(calls) == 1
    call = calls[0]
    kwargs = {k.arg: k.value for k in call.keywords}
    env = {"pnb": pnb}
    assert eval(ast.unparse(kwargs["distributed"]), env) == panel.distributed
    assert eval(ast.unparse(kwargs["precision"]), env) == panel.explanation.config
    assert eval(ast.unparse(kwargs["steps"])) == 7
    assert [eval(ast.unparse(a)) for a in call.args] == ["mlp"]
    assert eval(ast.unparse(kwargs["preset"])) == "tiny"
    assert "precision_nb call" in panel.widgets.code_title.value
    panel.set(strategy="none")
    assert "plain PyTorch" in panel.widgets.code_title.value
