"""The panel's Compare measures like ``profile``: this process's rounds, then fresh processes
until every interval is within the target or the panel's budget is spent; the header says which
process is measuring, the verdicts say over how many processes."""

from __future__ import annotations

import html
import re

import pytest
from notebook_cell import notebook_cell

from precision_nb.core.defaults import DEFAULT_BUDGET_S, MAX_PROCESSES
from precision_nb.views.panel import Panel

TIMEOUT = 300


def _compare(panel: Panel) -> list[str]:
    headers: list[str] = []
    panel.widgets.progress_label.observe(lambda c: headers.append(c["new"]), names="value")
    panel.widgets.compare_button.click()
    assert panel.wait(TIMEOUT)
    assert panel.error is None, panel.error
    return headers


def test_compare_of_a_notebook_model_measures_in_fresh_processes_within_the_budget() -> None:
    # the default budget: each fresh process is a new interpreter (about 5 s here, torch's import
    # included), so it leaves room for two on a machine twice as slow
    cell = notebook_cell()
    panel = Panel(
        cell["Net"](), cell["batches"], steps=6, compare_plans=("fp32", "bf16"), budget=40
    )
    try:
        headers = _compare(panel)
        m = panel.result.measurement
        n = m.process_count
        assert n >= 2, m.stopped_by
        # the three ways a measurement over processes ends; a tiny model can start the most
        # processes one measurement allows well within the budget
        stops = ("target:", "budget: 40 s", f"the maximum of {MAX_PROCESSES} processes")
        assert m.stopped_by.startswith(stops), m.stopped_by
        assert any(
            h.startswith("process 2: measuring every plan in a fresh process") for h in headers
        )
        verdict = panel.result.outcome("bf16").verdict.text
        assert f"over {n} processes" in verdict
        shown = panel.widgets.results_html.value
        assert html.escape(verdict) in shown or verdict in shown
        assert any("sent to the fresh processes by value" in e.message for e in m.events)
        # the charts are this process's runs: one record set per plan, as in a single process
        assert set(panel.records_frame["run"]) == {"fp32", "bf16"}
    finally:
        panel.close()


def test_compare_is_measured_as_a_profile_is_within_the_panels_budget() -> None:
    from precision_nb.core import defaults
    from precision_nb.views.panel.selection import compare_measure

    panel = Panel(preset="tiny", budget=25)
    try:
        cfg = compare_measure(panel.selection)
    finally:
        panel.close()
    assert (cfg.processes, cfg.target, cfg.budget_s) == (None, defaults.DEFAULT_TARGET, 25.0)
    assert cfg.warmup_max == defaults.DEFAULT_WARMUP_MAX and not cfg.refuse_small_budget


def test_the_budget_is_a_control_with_the_profiles_default_and_a_checked_range() -> None:
    panel = Panel(preset="tiny")
    try:
        assert panel.selection.budget == DEFAULT_BUDGET_S == panel.widgets.budget.value
        panel.set(budget=5)
        assert panel.selection.budget == 5.0
        for bad in (0, -1, float("nan"), "soon", 10_000):
            with pytest.raises(ValueError, match=re.escape("budget: invalid value")):
                panel.set(budget=bad)
            assert "budget" in panel.error
        assert panel.selection.budget == 5.0
    finally:
        panel.close()
