"""The panel's layout and its front door, headless: the header's one line, the tabs, every widget
named and typed in ``panel.widgets`` (and placed in the panel), the verbs and read-only state."""

from __future__ import annotations

import dataclasses
import html

import ipywidgets as widgets
import pytest

import precision_nb.views.panel.layout as layout_module
from precision_nb.views.panel import Panel
from precision_nb.views.panel.api import CONTROLS
from precision_nb.views.panel.layout import TABS, PanelWidgets, tab_name

TIMEOUT = 120


@pytest.fixture(scope="module")
def panel() -> Panel:
    made = Panel(steps=3, log_every=1)
    yield made
    made.close()


def _tree(root: widgets.Widget) -> set[int]:
    seen: set[int] = set()
    stack = [root]
    while stack:
        widget = stack.pop()
        if id(widget) not in seen:
            seen.add(id(widget))
            stack.extend(getattr(widget, "children", ()))
    return seen


def test_every_named_widget_is_typed_and_placed_in_the_panel(panel: Panel) -> None:
    named = panel.widgets
    placed = _tree(panel.widget)
    hints = PanelWidgets.__annotations__
    for field in dataclasses.fields(PanelWidgets):
        widget = getattr(named, field.name)
        expected = getattr(widgets, hints[field.name].removeprefix("widgets."))
        assert isinstance(widget, expected), field.name
        assert id(widget) in placed, f"{field.name} is not in the panel's widget tree"
    with pytest.raises(dataclasses.FrozenInstanceError):
        named.run_button = widgets.Button()  # type: ignore[misc]


def test_the_panel_is_a_front_door(panel: Panel) -> None:
    # widgets live in panel.widgets only; the state is read-only; the parts are not attributes
    for name in ("run_button", "status", "controls", "outputs", "session", "analysis"):
        assert not hasattr(panel, name), name
    for name in ("plan", "selection", "result", "error", "widgets", "distributed"):
        with pytest.raises(AttributeError):
            setattr(panel, name, None)
    verbs = {"set", "run", "compare", "stop", "wait", "inspect", "draw_figure", "close"}
    public = {n for n in vars(Panel) if not n.startswith("_") and callable(vars(Panel)[n])}
    assert public == verbs


@pytest.fixture
def fresh() -> Panel:
    made = Panel(steps=30)
    yield made
    made.close()


@pytest.mark.parametrize(
    ("name", "value", "refused"),  # what set() answers the same value with
    [("steps", -5, ValueError), ("mode", "fp8", ValueError), ("seed", "x", ValueError),
     ("device", "cuda:99", RuntimeError)],
)  # fmt: skip
def test_assigning_a_control_names_set_and_changes_nothing(fresh, name, value, refused) -> None:
    before = fresh.selection
    with pytest.raises(AttributeError, match=rf"use panel\.set\({name}={value!r}\)"):
        setattr(fresh, name, value)
    assert fresh.selection == before and name not in vars(fresh)
    assert f"panel.selection.{name} reads it" in str(_refused(fresh, name, value))
    with pytest.raises(refused, match=name):  # the call the message names gives set()'s error
        fresh.set(**{name: value})
    assert fresh.selection == before


def test_a_good_value_assigned_is_refused_too_and_set_applies_it(fresh) -> None:
    with pytest.raises(AttributeError, match=r"panel\.set\(steps=12\)"):
        fresh.steps = 12
    assert fresh.selection.steps == 30  # never "reads 12 while 30 steps run"
    fresh.set(steps=12)
    assert fresh.selection.steps == 12
    with pytest.raises(AttributeError, match=r"panel\.set\(strategy='ddp'\)"):
        fresh.strategy = "ddp"  # a Distributed tab control: no panel.selection field
    assert fresh.distributed is None


def test_no_other_attribute_can_be_created_or_deleted(fresh) -> None:
    for name in ("stepz", "foo", "_controller", "__dict__"):
        with pytest.raises(AttributeError, match="takes no new ones.*allowed names: device"):
            setattr(fresh, name, 1)
    with pytest.raises(AttributeError, match="panel.result is read-only"):
        fresh.result = None
    with pytest.raises(AttributeError, match="cannot be deleted"):
        del fresh._controller
    assert set(vars(fresh)) == {"_controller", "_finalizer"}
    fresh.set(steps=4)  # still whole
    assert fresh.selection.steps == 4


def test_the_controls_named_are_the_ones_set_takes(fresh) -> None:
    with pytest.raises(ValueError, match="not a panel control") as info:
        fresh.set(bogus=1)
    listed = str(info.value).split("allowed: ", 1)[1].replace(";", ",").split(",")
    assert {n.strip() for n in listed} | {"code_framework"} == set(CONTROLS)


def _refused(panel: Panel, name: str, value: object) -> AttributeError:
    try:
        setattr(panel, name, value)
    except AttributeError as exc:
        return exc
    raise AssertionError(f"panel.{name} = {value!r} was accepted")


def test_the_header_says_device_request_and_plan_in_one_line(panel: Panel) -> None:
    panel.set(device="cpu", mode="fp16", loss_scale_lab=False)
    line = html.unescape(panel.widgets.headline.value)
    assert "request <b>fp16</b> → plan <b>fp32</b>" in line
    assert "(fallback)" in line and "explicit fp16 on CPU falls back to fp32" in line  # hover
    assert "no autocast · no loss scaler" in line
    assert "this machine" in panel.widgets.badge.value
    panel.set(loss_scale_lab=True)
    line = html.unescape(panel.widgets.headline.value)
    assert "request <b>fp16 + loss-scale lab</b> → plan <b>fp16</b>" in line
    assert "(fallback)" not in line and "autocast torch.float16 · loss scaler" in line
    panel.set(device="cuda-bf16", mode="auto", loss_scale_lab=False)
    assert "SIMULATED" in panel.widgets.badge.value
    assert "plan <b>bf16</b>" in html.unescape(panel.widgets.headline.value)
    panel.set(device="cpu", mode="auto")


def test_an_unresolvable_selection_says_so_in_the_header(panel: Panel) -> None:
    panel.widgets.device_text.value = "cuda:7"
    try:
        assert "cannot be resolved" in panel.widgets.headline.value
        assert panel.widgets.error_box.layout.display != "none"
        assert panel.widgets.run_button.disabled
        # the error box comes before the reason beside the buttons, which points up to it
        header = panel.widget.children[0].children
        assert header.index(panel.widgets.error_box) < header.index(panel.widgets.run_reason)
        assert "message above" in panel.widgets.run_reason.value
        # the empty code area says why it is empty
        assert panel.widgets.code_area.value == ""
        assert "cannot be resolved" in panel.widgets.code_area.placeholder
    finally:
        panel.widgets.device_text.value = ""
    assert panel.error is None and "plan <b>" in panel.widgets.headline.value


def test_tabs_in_order_and_the_distributed_title_follows_the_strategy(panel: Panel) -> None:
    tabs = panel.widgets.tabs
    assert tuple(tabs.titles) == TABS
    assert tab_name(tabs.selected_index) == "Plan"
    assert panel.widgets.strategy in tabs.children[TABS.index("Distributed")].children[0].children
    panel.set(strategy="ddp", nproc=2)
    try:
        assert tabs.titles[TABS.index("Distributed")] == "Distributed: ddp x2"
        assert "ddp x2 (torchrun)" in panel.widgets.headline.value
    finally:
        panel.set(distributed=None)
    assert tabs.titles[TABS.index("Distributed")] == "Distributed"


def test_run_shows_the_live_tab_and_a_run_keeps_it(panel: Panel) -> None:
    tabs = panel.widgets.tabs
    tabs.selected_index = TABS.index("Plan")
    panel.run(block=True, timeout=TIMEOUT)
    assert tab_name(tabs.selected_index) == "Live"
    assert "single-run figures" in panel.widgets.results_html.value  # the Compare tab's table
    assert "pnb-verdict" not in panel.widgets.results_html.value  # no verdict for one run


def test_a_comparison_left_on_another_tab_stays_there() -> None:
    panel = Panel(steps=2, log_every=1, compare_plans=("fp32", "bf16"))
    try:
        job_started = panel.compare()
        assert job_started is None and tab_name(panel.widgets.tabs.selected_index) == "Live"
        panel.widgets.tabs.selected_index = TABS.index("Plan")  # the user looks elsewhere
        assert panel.wait(TIMEOUT) and panel.error is None, panel.error
        assert tab_name(panel.widgets.tabs.selected_index) == "Plan"
    finally:
        panel.close()


def test_the_style_is_scoped_to_the_panel() -> None:
    css = layout_module.PANEL_STYLE.removeprefix("<style>").removesuffix("</style>")
    selectors = [
        s.strip() for rule in css.split("}") if "{" in rule for s in rule.split("{")[0].split(",")
    ]
    assert len(selectors) > 5 and all(s.startswith(".pnb-panel ") for s in selectors), selectors
