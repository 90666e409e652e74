"""The panel in a real browser: JupyterLab + headless Chromium, driven like a user would.

Opens the explore notebook, runs every cell, then works the first panel it shows: the header
and the Plan tab's controls are visible, changing mode and device updates the shown plan (and
the header's one line), Run completes with figures in the Live tab, Compare ends in the Compare
tab with each plan's verdict first and a table that fits the output, opening the Memory tab
inspects, Stop ends a long run, and bad input is shown readably in the header with Run disabled.
Screenshots of the panel (every tab) land in ``artifacts/`` (``PRECISION_NB_ARTIFACTS``).

The README's picture is its own test: a panel whose loss-scale lab starts at a scale that
overflows, compared within the default budget in fresh processes, pictured on its Compare tab
(verdicts over processes, the table, loss scale and throughput charts) above its Memory tab
(memory by kind and dtype). It carries the panel's source hash and the tabs' text
(tests/browser/readme_image.py); with ``PRECISION_NB_UPDATE_SCREENSHOT=1`` it replaces the
README's image.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest
from playwright.sync_api import Locator, expect

from tests.browser.lab import first_panel, open_notebook, run_all_cells
from tests.browser.readme_image import (
    INTERVAL,
    PROCESSES,
    README_IMAGE,
    save_with_provenance,
    stack_images,
)

NOTEBOOK = "01_explore_precision.ipynb"

pytestmark = pytest.mark.timeout(240)


def _toggle(panel: Locator, css: str, label: str) -> None:
    panel.locator(f".{css} button").filter(
        has_text=re.compile(rf"^\s*{re.escape(label)}\s*$")
    ).click()


def _set_int(panel: Locator, css: str, value: float) -> None:
    box = panel.locator(f".{css} input")
    box.fill(str(value))
    box.press("Enter")
    box.press("Tab")


def _select_starting(panel: Locator, css: str, prefix: str) -> None:
    select = panel.locator(f".{css} select")
    labels = select.evaluate("s => Array.from(s.options).map(o => o.textContent)")
    matches = [label for label in labels if label.replace("\xa0", " ").startswith(prefix)]
    assert matches, f"no option of {css} starts with {prefix!r}: {labels}"
    select.select_option(label=matches[0])


def _open_tab(panel: Locator, name: str) -> None:
    panel.locator(".pnb-tabs .lm-TabBar-tab").filter(
        has_text=re.compile(rf"^\s*{re.escape(name)}\s*$")
    ).click()


def _assert_fits(panel: Locator, css: str) -> None:
    """Every cell of the table ``css`` on one line, and the table within the panel's width."""
    table = panel.locator(f"{css} table").first
    box, outer = table.bounding_box(), panel.bounding_box()
    assert box is not None and outer is not None
    assert box["x"] + box["width"] <= outer["x"] + outer["width"] + 1, (box, outer)
    heights = table.locator("tbody td").evaluate_all("cells => cells.map(c => c.offsetHeight)")
    line = table.locator("tbody td").first.evaluate(
        "c => parseFloat(getComputedStyle(c).lineHeight) || 16"
    )
    assert heights and max(heights) < 2 * line + 6, (heights, line)


def _image_loaded(image: Locator, timeout_ms: float = 15_000) -> bool:
    """True once the figure's PNG is decoded and has a size (it loads asynchronously)."""
    handle = image.element_handle()
    image.page.wait_for_function(
        "img => img.complete && img.naturalWidth > 0", arg=handle, timeout=timeout_ms
    )
    return bool(handle.evaluate("img => img.naturalWidth * img.naturalHeight > 0"))


def test_panel_works_in_jupyterlab(lab_server, browser_page, artifacts_dir):
    page = browser_page
    open_notebook(page, lab_server.notebook_url(NOTEBOOK))
    run_all_cells(page)
    panel = first_panel(page)
    panel.scroll_into_view_if_needed()

    # The header and the Plan tab's controls are there and usable.
    for css in ("pnb-badge", "pnb-headline", "pnb-tabs"):
        expect(panel.locator(f".{css}").first).to_be_visible()
    for css in ("pnb-device", "pnb-mode", "pnb-dtype", "pnb-fused", "pnb-steps", "pnb-plan"):
        expect(panel.locator(f".{css}").first).to_be_visible()
    run, stop = panel.locator("button.pnb-run"), panel.locator("button.pnb-stop")
    expect(run).to_be_enabled()
    expect(stop).to_be_disabled()
    panel.screenshot(path=str(artifacts_dir / "panel-before-run.png"))

    # Changing device and mode in the UI re-resolves the shown plan, with its reason, and the
    # header's one line follows.
    plan, headline = panel.locator(".pnb-plan"), panel.locator(".pnb-headline")
    panel.locator(".pnb-device select").select_option(label="cpu")
    _toggle(panel, "pnb-mode", "fp16")
    expect(plan).to_contain_text("fp32 on cpu")
    expect(plan).to_contain_text("explicit fp16 on CPU falls back to fp32")
    expect(headline).to_contain_text(re.compile(r"request fp16 → plan fp32 \(fallback\)"))
    expect(panel.locator(".pnb-dtype select")).to_be_disabled()  # dtype matters only in auto
    _toggle(panel, "pnb-mode", "bf16")
    expect(plan).to_contain_text("bf16 on cpu")
    expect(headline).to_contain_text("request bf16 → plan bf16")

    # A simulated GPU shows the badge and refuses to run, saying why.
    _select_starting(panel, "pnb-device", "[simulated] cuda-bf16 (")
    expect(panel.locator(".pnb-badge")).to_contain_text("simulated", ignore_case=True)
    expect(run).to_be_disabled()
    expect(panel.locator(".pnb-run-reason")).to_contain_text("simulated", ignore_case=True)
    panel.locator(".pnb-device select").select_option(label="cpu")
    expect(run).to_be_enabled()

    # Run: the Live tab opens; progress completes, the live charts and the figure appear.
    _set_int(panel, "pnb-steps", 12)
    run.click()
    status = panel.locator(".pnb-status")
    expect(status).to_contain_text("Finished", timeout=120_000)
    expect(panel.locator(".pnb-progress-label")).to_contain_text("12")
    expect(panel.locator(".pnb-live-charts svg")).to_have_count(4)
    expect(panel.locator(".pnb-live-metrics")).to_contain_text("single-run figures")
    # A short run leaves the matplotlib figure to Draw figure (it would cost more than the
    # plotting budget allows), and says so.
    figure = panel.locator("img.pnb-figures")
    draw = panel.locator("button.pnb-figure-button")
    expect(figure).to_be_hidden()
    expect(panel.locator(".pnb-figures-note")).to_contain_text("not drawn")
    draw.click()
    expect(figure).to_be_visible(timeout=60_000)
    assert _image_loaded(figure)
    panel.screenshot(path=str(artifacts_dir / "panel-live.png"))
    _open_tab(panel, "Compare")  # a single run's figures, marked as such
    expect(panel.locator(".pnb-results table").first).to_be_visible()
    expect(panel.locator(".pnb-results")).to_contain_text("single-run figures")

    # Compare: the Live tab while it goes, then the Compare tab, each plan's verdict first (a
    # short budget: the README's picture below measures within the default one).
    _open_tab(panel, "Plan")
    _set_int(panel, "pnb-budget", 5)
    panel.locator("button.pnb-compare").click()
    expect(status).to_contain_text(re.compile(r"Finished: [2-9] run"), timeout=150_000)
    runs = int(re.search(r"Finished: (\d) run", status.inner_text()).group(1))
    results = panel.locator(".pnb-results")
    expect(results).to_be_visible()  # the Compare tab opened by itself
    expect(results.locator(".pnb-verdict")).to_have_count(runs)
    expect(results.locator("table.pnb-table").first.locator("tbody tr")).to_have_count(runs)
    expect(results).to_contain_text("speedup vs fp32 (95 % CI)")
    shot = artifacts_dir / "panel-after-compare-raw.png"
    page.screenshot(path=str(shot), clip=panel.bounding_box())
    _assert_fits(panel, ".pnb-results")
    compare_text = results.inner_text()
    assert INTERVAL.search(compare_text), compare_text  # a speedup with its interval is shown
    _open_tab(panel, "Live")
    expect(panel.locator(".pnb-warmup")).to_contain_text("step(s)")
    draw.click()
    expect(figure).to_be_visible(timeout=60_000)
    assert _image_loaded(figure)

    # Memory / Ops / Numerics: opening the Memory tab inspects the plans.
    _open_tab(panel, "Memory")
    expect(panel.locator(".pnb-analysis-note")).to_contain_text("Inspected", timeout=120_000)
    expect(panel.locator(".pnb-memory svg.pnb-memory-chart")).to_be_visible()
    panel.screenshot(path=str(artifacts_dir / "panel-memory.png"))
    # The other tabs, each pictured for a look at how it reads.
    for name, shown in (
        ("Ops", ".pnb-ops table"),
        ("Numerics", ".pnb-numerics table.pnb-underflow"),
        ("Distributed", ".pnb-dist-strategy"),
    ):
        _open_tab(panel, name)
        expect(panel.locator(shown)).to_be_visible()
        panel.screenshot(path=str(artifacts_dir / f"panel-{name.lower()}.png"))
    _open_tab(panel, "Compare")
    results.locator("summary").filter(has_text="All columns").click()
    expect(results.locator("table.pnb-all-columns")).to_be_visible()
    panel.screenshot(path=str(artifacts_dir / "panel-all-columns.png"))

    # Stop: a long run is ended between steps; a second Run is impossible meanwhile.
    _open_tab(panel, "Plan")
    _set_int(panel, "pnb-steps", 20_000)
    run.click()
    expect(stop).to_be_enabled(timeout=30_000)
    expect(run).to_be_disabled()
    expect(panel.locator(".pnb-progress-label")).to_contain_text(re.compile(r"\d+\s*/\s*20000"))
    stop.click()
    expect(status).to_contain_text("Stopped", timeout=60_000)
    expect(run).to_be_enabled()

    # Bad input is shown in the header, readable, Run is disabled with the reason, and the panel
    # stays usable.
    _open_tab(panel, "Plan")
    device_text = panel.locator(".pnb-device-text input")
    device_text.fill("cuda:7")
    device_text.press("Enter")
    error = panel.locator(".pnb-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("cuda:7")
    expect(run).to_be_disabled()
    expect(panel.locator(".pnb-run-reason")).to_contain_text("cannot be resolved")
    box = error.bounding_box()
    assert box is not None and box["height"] >= 16 and box["width"] >= 200
    panel.screenshot(path=str(artifacts_dir / "panel-error.png"))
    device_text.fill("")
    device_text.press("Enter")
    panel.locator(".pnb-device select").select_option(label="cpu")
    expect(error).to_be_hidden()
    expect(run).to_be_enabled()


#: The README's panel: the loss-scale lab starts at 2^24, so its first steps overflow; the scale
#: backs off on every skipped step and grows again after 6 clean ones. The budget leaves room for
#: fresh processes (new interpreters, about 5 s each here) on a machine several times slower.
README_CELL = """import precision_nb as pnb

panel = pnb.Panel(
    workload="mlp",
    preset="tiny",
    steps=24,
    compare_plans=("fp32", "bf16", "fp16 + loss-scale lab"),
    train_options={"init_scale": 2.0**24, "growth_interval": 6},
    budget=60,
)
panel"""


def _notebook(source: str) -> str:
    import json

    cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": source.splitlines(keepends=True)}  # fmt: skip
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return json.dumps({"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4,
                       "nbformat_minor": 5})  # fmt: skip


@pytest.mark.timeout(600)
def test_the_readme_picture_shows_the_lab_memory_and_verdicts_over_processes(
    lab_server, browser_page, artifacts_dir
):
    page = browser_page
    (lab_server.root / "readme_picture.ipynb").write_text(_notebook(README_CELL))
    open_notebook(page, lab_server.notebook_url("readme_picture.ipynb"))
    run_all_cells(page)
    panel = first_panel(page)
    panel.scroll_into_view_if_needed()
    panel.locator("button.pnb-compare").click()
    status = panel.locator(".pnb-status")
    expect(status).to_contain_text("Finished: 3 run", timeout=400_000)
    # the job has ended (its after-run work included) once Compare can be pressed again
    expect(panel.locator("button.pnb-compare")).to_be_enabled(timeout=120_000)
    _open_tab(panel, "Compare")
    results = panel.locator(".pnb-results")
    expect(results).to_be_visible()
    expect(results.locator(".pnb-verdict")).to_have_count(3)
    compare_text = results.inner_text()
    assert PROCESSES.search(compare_text), compare_text  # verdicts over fresh processes
    assert INTERVAL.search(compare_text), compare_text
    compare_shot = artifacts_dir / "readme-compare.png"
    page.screenshot(path=str(compare_shot), clip=panel.bounding_box())

    _open_tab(panel, "Memory")
    expect(panel.locator(".pnb-analysis-note")).to_contain_text("Inspected", timeout=120_000)
    memory = panel.locator(".pnb-memory")
    expect(memory.locator("svg.pnb-memory-chart")).to_be_visible()
    memory_text = memory.inner_text()
    assert "optimizer state" in memory_text, memory_text
    memory_shot = artifacts_dir / "readme-memory.png"
    page.screenshot(path=str(memory_shot), clip=memory.bounding_box())

    picture = artifacts_dir / "readme-picture.png"
    stack_images([compare_shot, memory_shot], picture)
    after = artifacts_dir / "panel-after-compare.png"
    save_with_provenance(picture, after, f"{compare_text}\n{memory_text}")
    if os.environ.get("PRECISION_NB_UPDATE_SCREENSHOT") == "1":
        README_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(after, README_IMAGE)
