"""report.html as a reader sees it in headless Chromium: the answer on the first screen, nothing
wider than the page, the settings last and closed. The screenshot is kept in the artifacts."""

from __future__ import annotations

from pathlib import Path

from precision_nb.cli.main import main

FIRST_SCREEN = (1280, 900)


def test_the_report_leads_with_the_answer_and_fits_the_page(browser_page, tmp_path, artifacts_dir):
    out = tmp_path / "report"
    args = ["profile", "--no-progress", "--preset", "tiny", "--steps", "4", "--rounds", "2"]
    assert main([*args, "--device", "cpu", "--out", str(out)]) == 0
    page = browser_page
    page.set_viewport_size({"width": FIRST_SCREEN[0], "height": FIRST_SCREEN[1]})
    page.goto((out / "report.html").as_uri())
    page.screenshot(path=str(Path(artifacts_dir) / "report-first-screen.png"))
    # The answer first: every plan's card, with its verdict line, on the first screen.
    cards = page.locator("#answer .card")
    assert cards.count() == 2  # fp32 and bf16 (fp16 merged into fp32 on a CPU)
    for i in range(cards.count()):
        verdict = cards.nth(i).locator(".verdict")
        assert verdict.inner_text().strip()
        assert verdict.bounding_box()["y"] < FIRST_SCREEN[1]
    # No sideways scroll, and no table past the right edge (the op trace included).
    widths = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths
    past = page.evaluate(
        "Array.from(document.querySelectorAll('table')).filter(t =>"
        " t.getBoundingClientRect().right > document.documentElement.clientWidth + 1).length"
    )
    assert past == 0
    # The settings come last, closed.
    ids = page.evaluate("Array.from(document.querySelectorAll('section')).map(s => s.id)")
    assert ids[0] == "answer" and ids[-1] == "settings"
    assert page.evaluate("document.querySelector('#settings details').open") is False
