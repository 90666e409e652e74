"""Driving JupyterLab from Playwright: open a notebook, run every cell, find the panel."""

from __future__ import annotations

import re

from playwright.sync_api import Locator, Page, expect

KERNEL_IDLE = re.compile(r"\|\s*Idle")


def wait_for_idle_kernel(page: Page, timeout_ms: float = 90_000) -> None:
    expect(page.locator(".jp-StatusBar-Widget").get_by_text(KERNEL_IDLE)).to_be_visible(
        timeout=timeout_ms
    )


def open_notebook(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=90_000)
    wait_for_idle_kernel(page)


def wait_for_cells_done(page: Page, timeout_ms: float = 150_000) -> None:
    """Wait until no cell is queued or running and the kernel is idle: widget events (clicks,
    changed values) are processed only once the kernel is free. (Run All stops at a cell that
    raises on purpose, so cells after it may stay unrun.)"""
    page.wait_for_function(
        r"""() => {
            const prompts = Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt'))
                .map(p => p.textContent);
            return prompts.some(t => /\[\d+\]/.test(t)) && !prompts.some(t => t.includes('[*]'));
        }""",
        timeout=timeout_ms,
    )
    wait_for_idle_kernel(page, timeout_ms)


def run_all_cells(page: Page, attempts: int = 3) -> None:
    """Run > Run All Cells and wait until every cell has run. A kernel that has just started may
    drop the first request, so the command is repeated until the first code cell shows an
    execution count."""
    first_prompt = page.locator(".jp-CodeCell .jp-InputPrompt").first
    for _ in range(attempts):
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.locator("li[data-command='runmenu:run-all']").click()
        try:
            expect(first_prompt).to_have_text(re.compile(r"\[(\d+|\*)\]"), timeout=15_000)
        except AssertionError:
            page.keyboard.press("Escape")
            wait_for_idle_kernel(page)
            continue
        wait_for_cells_done(page)
        return
    raise AssertionError("JupyterLab did not start executing the notebook's cells")


def first_panel(page: Page, timeout_ms: float = 120_000) -> Locator:
    panel = page.locator(".pnb-panel").first
    expect(panel).to_be_visible(timeout=timeout_ms)
    return panel
