"""Panel resources: close() releases widgets, model and results and stops a run; a panel nobody
references is collected (its widgets closed, its model freed)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from ipywidgets.widgets.widget import _instances
from torch import nn

from precision_nb.views.panel import Panel

TIMEOUT = 120


def _batches() -> list:
    return [(torch.randn(3, 4), torch.randint(0, 2, (3,)))]


def test_fifty_panels_created_and_dropped_leave_no_widgets_behind() -> None:
    gc.collect()
    start = len(_instances)
    per_panel = len(_instances)
    for index in range(50):
        panel = Panel(steps=2)
        if index == 0:
            per_panel = len(_instances) - start
        del panel
    gc.collect()
    assert per_panel > 50  # each panel opens many widgets (layouts and styles included)
    assert len(_instances) - start <= 5


def test_close_closes_every_widget_of_the_panel() -> None:
    gc.collect()
    start = len(_instances)
    panel = Panel(steps=2)
    opened = len(_instances) - start
    panel.close()
    assert opened > 50 and len(_instances) - start <= 0
    assert panel.closed
    with pytest.raises(RuntimeError, match="closed"):
        panel.run()
    with pytest.raises(RuntimeError, match="closed"):
        panel.set(mode="bf16")
    panel.close()  # twice is harmless


def test_dropped_panel_frees_a_32_mib_model_even_after_a_run() -> None:
    model = nn.Linear(2048, 4096, bias=False)  # 8 Mi float32 parameters: 32 MiB
    assert sum(p.numel() * p.element_size() for p in model.parameters()) == 32 * 2**20
    batches = [(torch.randn(2, 2048), torch.randint(0, 4096, (2,)))]
    gone = weakref.ref(model)
    panel = Panel(model, batches, steps=1, log_every=1)
    panel.run(block=True, timeout=TIMEOUT)
    del model, batches
    gc.collect()
    assert gone() is not None  # the panel still holds it while referenced
    del panel
    gc.collect()
    assert gone() is None


def test_close_drops_model_and_results() -> None:
    model = nn.Linear(4, 2)
    gone = weakref.ref(model)
    panel = Panel(model, _batches(), steps=2, log_every=1)
    result = weakref.ref(panel.run(block=True, timeout=TIMEOUT))
    del model
    panel.close()
    gc.collect()
    assert gone() is None and result() is None
    assert panel.result is None and panel.records_frame.empty


def test_close_stops_a_running_job() -> None:
    panel = Panel(steps=100_000, log_every=1)
    panel.run()
    job = panel._controller.session.job
    deadline = TIMEOUT
    while not panel._controller.session.last_live.records and deadline > 0:  # a few steps in
        job.wait(0.05)
        deadline -= 0.05
    panel.close(timeout=TIMEOUT)
    assert not job.running and job.stop_event.is_set()
    assert job.result.stopped and job.result.steps < 100_000
    assert not panel.running


def test_dropping_a_running_panel_stops_its_run() -> None:
    panel = Panel(steps=100_000, log_every=1)
    panel.run()
    job = panel._controller.session.job
    del panel
    gc.collect()
    assert job.wait(TIMEOUT) and job.stop_event.is_set()
