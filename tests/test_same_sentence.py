"""One comparison, one verdict sentence per plan, read the same on every surface.

A small in-process profile is measured once; the command line's printout, the report folder,
the panel's Compare tab, ``Profile.__repr__`` and ``Profile._repr_html_`` are all rendered from
that same :class:`~precision_nb.engine.comparison.Comparison`, and each must carry each plan's
verdict verbatim (a surface that rewrote "×" as "x", or a dash, would fail here).
"""

from __future__ import annotations

import contextlib
import html
import io
import re

import pytest

from precision_nb.cli.profile import _print_outcome
from precision_nb.core.text import TIMES
from precision_nb.views.panel.results import results_html
from precision_nb.views.report.profile import profile

#: A small comparison measured in this process: enough rounds for an interval, nothing else.
SMALL = {"preset": "tiny", "compare": ("fp32", "bf16"), "device": "cpu", "steps": 12}
SMALL |= {"rounds": 6, "processes": 1, "progress": False}
SMALL |= dict.fromkeys(("inspect", "numerics", "time_split"), False)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("same-sentence")
    return profile("mlp", out=out, **SMALL), out


def _text(page: str) -> str:
    """A page's text as a reader sees it: tags dropped, entities read, whitespace folded."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def _lines(page: str, css: str) -> list[str]:
    """The text of each element of class ``css`` (a verdict's own line or card paragraph)."""
    pattern = rf"<(div|p) class=['\"]{css}['\"][^>]*>(.*?)</\1>"
    return [_text(m.group(2)) for m in re.finditer(pattern, page, re.S)]


def _says_each(lines: list[str], verdicts: dict[str, str]) -> None:
    for verdict in verdicts.values():
        assert any(" ".join(verdict.split()) in line for line in lines), (verdict, lines)


def _verdicts(result) -> dict[str, str]:
    verdicts = result.verdicts
    assert set(verdicts) == {"fp32", "bf16"}
    # the measured plan's sentence carries a ratio, so a surface that re-words it is caught
    assert TIMES in verdicts["bf16"], verdicts["bf16"]
    return verdicts


def test_the_command_line_prints_each_verdict_verbatim(measured):
    result, _ = measured
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _print_outcome(result)
    for verdict in _verdicts(result).values():
        assert verdict in printed.getvalue()


def test_the_report_folder_says_each_verdict_verbatim(measured):
    result, out = measured
    page = (out / "report.html").read_text(encoding="utf-8")
    _says_each(_lines(page, "verdict"), _verdicts(result))


def test_the_panel_compare_tab_shows_each_verdict_verbatim(measured):
    result, _ = measured
    comparison = result.comparison
    tab = results_html(result.summary, comparison.outcomes, measured=True, method=comparison.method)
    _says_each(_lines(tab, "pnb-verdict"), _verdicts(result))


def test_the_notebook_views_show_each_verdict_verbatim(measured):
    result, _ = measured
    _says_each(_lines(result._repr_html_(), "verdict"), _verdicts(result))
    for verdict in _verdicts(result).values():
        assert verdict in repr(result)


def test_the_check_fails_on_a_surface_that_rewrites_the_glyph(measured):
    result, _ = measured
    verdict = _verdicts(result)["bf16"]
    rewritten = result._repr_html_().replace(TIMES, "x")
    with pytest.raises(AssertionError):
        _says_each(_lines(rewritten, "verdict"), {"bf16": verdict})
