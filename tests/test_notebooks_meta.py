"""Static checks of the tutorial notebooks: what nbval cannot see by running them.

nbval (scripts/test.sh, ``--nbval-lax``) executes every notebook and compares the stored output of
the cells marked ``# NBVAL_CHECK_OUTPUT``. These tests make sure that run is a real test: every
notebook checks cells that carry stored output, cells that demonstrate an error carry the
``raises-exception`` tag (which nbval, JupyterLab's Run All, nbconvert and papermill all honour)
and show the message, nothing else stores an error, the stored outputs come from one
top-to-bottom run in a python3 kernel, the notebooks use only the public API, and the sanitizer
that scripts/test.sh names is valid.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = (
    "01_explore_precision.ipynb",
    "02_mixed_precision_tradeoffs.ipynb",
    "03_profile_your_model.ipynb",
    "04_memory_and_ops.ipynb",
    "05_numerics_and_fp8.ipynb",
    "06_checklist.ipynb",
    "07_distributed.ipynb",
    "08_mixed_vs_true.ipynb",
    "09_why_faster.ipynb",
)
CHECK = "# NBVAL_CHECK_OUTPUT"
RAISES_TAG = "raises-exception"
# nbval's comment for the same thing: only nbval reads it, so Run All, nbconvert and papermill
# would stop at the cell; the tag replaces it (both at once make nbval warn)
RAISES_COMMENT = "NBVAL_RAISES_EXCEPTION"
MIN_CHECKED = 3
MAX_BYTES = 1_000_000  # stored outputs stay small enough to review and to load on Binder
MAX_IMAGES = 6

# What notebook code may import from the package: the top-level API and the views modules the
# architecture documents (figures, tables, hints, report).
ALLOWED_IMPORT = re.compile(
    r"^(import precision_nb as pnb"
    r"|from precision_nb\.views\.report(\.(figures|tables|hints))? import .+)$"
)


def load(name: str) -> dict[str, Any]:
    return json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))


def code_cells(nb: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def source(cell: dict[str, Any]) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def raises(cell: dict[str, Any]) -> bool:
    return RAISES_TAG in cell["metadata"].get("tags", [])


def first_line(cell: dict[str, Any]) -> str:
    lines = source(cell).splitlines()
    return lines[0].strip() if lines else ""


def test_every_notebook_is_listed() -> None:
    found = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert found == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_kernel_is_python3(name: str) -> None:
    meta = load(name)["metadata"]
    assert meta["kernelspec"]["name"] == "python3"
    assert meta["kernelspec"]["language"] == "python"


@pytest.mark.parametrize("name", NAMES)
def test_checked_cells_have_stored_output(name: str) -> None:
    checked = [c for c in code_cells(load(name)) if CHECK in source(c)]
    assert len(checked) >= MIN_CHECKED, f"{name}: only {len(checked)} checked cells"
    for cell in checked:
        assert first_line(cell) == CHECK, f"{name}: marker not on the first line: {source(cell)!r}"
        assert cell["outputs"], f"{name}: checked cell has no stored output: {source(cell)!r}"
        kinds = {o["output_type"] for o in cell["outputs"]}
        assert "error" not in kinds, f"{name}: checked cell stores an error: {source(cell)!r}"


@pytest.mark.parametrize("name", NAMES)
def test_errors_only_where_marked_as_raising(name: str) -> None:
    for cell in code_cells(load(name)):
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        assert RAISES_COMMENT not in source(cell), f"{name}: use the {RAISES_TAG!r} tag instead"
        if raises(cell):
            assert len(errors) == 1, f"{name}: raising cell without its error: {source(cell)!r}"
            assert errors[0]["ename"] in ("ValueError", "RuntimeError")
            assert len(errors[0]["evalue"]) > 40, "the message should say what is allowed"
        else:
            assert not errors, f"{name}: unexpected stored error in {source(cell)!r}"


def test_bad_input_is_demonstrated_and_run_all_reaches_it() -> None:
    cells = code_cells(load(NAMES[0]))
    raising = [c for c in cells if raises(c)]
    # absent hardware raises RuntimeError, in the last code cell (the tag lets Run All go past it,
    # but an error is where a reader stops reading)
    assert raising == cells[-1:]
    assert [o["ename"] for o in raising[0]["outputs"] if o["output_type"] == "error"] == [
        "RuntimeError"
    ]
    shown = [
        "".join(o.get("text", ""))
        for c in cells
        if CHECK in source(c) and "ValueError" in source(c)
        for o in c["outputs"]
    ]
    assert any("allowed" in text for text in shown), "a checked cell shows a ValueError message"


@pytest.mark.parametrize("name", NAMES)
def test_outputs_come_from_one_top_to_bottom_run(name: str) -> None:
    counts = [c["execution_count"] for c in code_cells(load(name))]
    assert counts == list(range(1, len(counts) + 1)), f"{name}: execution counts {counts}"


@pytest.mark.parametrize("name", NAMES)
def test_no_skipped_cells(name: str) -> None:
    for cell in code_cells(load(name)):
        assert "NBVAL_SKIP" not in source(cell), f"{name}: skipped cell {source(cell)!r}"


@pytest.mark.parametrize("name", NAMES)
def test_only_public_api(name: str) -> None:
    for cell in code_cells(load(name)):
        for line in source(cell).splitlines():
            stripped = line.strip()
            if "precision_nb" in stripped and stripped.startswith(("import ", "from ")):
                assert ALLOWED_IMPORT.match(stripped), f"{name}: {stripped}"
            assert not re.search(r"\b(pnb|precision_nb)\._", stripped), f"{name}: {stripped}"
            assert not re.search(r"\.\b_[a-z]\w*", stripped), f"{name}: private name: {stripped}"


@pytest.mark.parametrize("name", NAMES)
def test_reads_as_a_document(name: str) -> None:
    cells = load(name)["cells"]
    assert cells[0]["cell_type"] == "markdown"
    assert source(cells[0]).startswith("# ")
    markdown = [c for c in cells if c["cell_type"] == "markdown"]
    assert len(markdown) * 2 >= len(code_cells({"cells": cells})), f"{name}: too little prose"


@pytest.mark.parametrize("name", NAMES)
def test_stored_outputs_stay_small(name: str) -> None:
    path = NOTEBOOKS / name
    nb = load(name)
    assert path.stat().st_size < MAX_BYTES
    assert "widgets" not in nb["metadata"], f"{name}: stored widget state; strip it"
    images = sum("image/png" in o.get("data", {}) for c in code_cells(nb) for o in c["outputs"])
    assert images <= MAX_IMAGES


#: A display whose plain-text form is only an object's address (a pandas ``Styler``, say): what
#: nbconvert to text, GitHub's diff view and nbval's logs would show of it.
OBJECT_REPR = re.compile(r"^<[\w.]+ (object )?at 0x[0-9a-fA-F]+>$")


@pytest.mark.parametrize("name", NAMES)
def test_every_display_has_a_text_form(name: str) -> None:
    for cell in code_cells(load(name)):
        for out in cell["outputs"]:
            plain = out.get("data", {}).get("text/plain", "")
            text = (plain if isinstance(plain, str) else "".join(plain)).strip()
            assert not OBJECT_REPR.match(text), f"{name}: {text!r} in {source(cell)[:60]!r}"


#: Text a reader of the notebook as text cannot read: a table cell or a reason cut short by pandas'
#: column width ("(no autocas..."), or a widget tree printed in place of the widget.
CUT_SHORT = re.compile(r"\w\.\.\.(?=\s|$)", re.MULTILINE)
WIDGET_TREE = re.compile(r"^(VBox|HBox|Tab|Box)\(children=")


def output_text(out: dict[str, Any]) -> str:
    text = out.get("text", out.get("data", {}).get("text/plain", ""))
    return text if isinstance(text, str) else "".join(text)


@pytest.mark.parametrize("name", NAMES)
def test_no_output_is_cut_short_or_a_widget_tree(name: str) -> None:
    for cell in code_cells(load(name)):
        for out in cell["outputs"]:
            text = output_text(out)
            cut = CUT_SHORT.search(text)
            assert cut is None, (
                f"{name}: cut short near {text[max(0, cut.start() - 40) : cut.end()]!r}"
            )
            assert not WIDGET_TREE.match(text.strip()), (
                f"{name}: widget tree as text: {text[:60]!r}"
            )


def test_the_text_checks_can_fail() -> None:
    assert CUT_SHORT.search("4  fp32: autocast leaves the op alone (no autocas...      6")
    assert CUT_SHORT.search("measured: CPU float32 matmul, best of sizes 25...")
    assert not CUT_SHORT.search("reductions (sum, norm, ...) and 1.0 ... 2.0")
    assert WIDGET_TREE.match("VBox(children=(HBox(children=(HTML(value=")


def test_sanitizer_is_the_one_the_test_command_uses_and_is_valid() -> None:
    cfg = NOTEBOOKS / "sanitize.cfg"
    assert "--nbval-sanitize-with notebooks/sanitize.cfg" in (ROOT / "scripts/test.sh").read_text()
    # the format nbval reads: "regex: ..." directly followed by "replace: ..."
    pairs = re.findall(r"^regex: (.*)$\n^replace: (.*)$", cfg.read_text(), flags=re.MULTILINE)
    assert len(pairs) >= 3
    compiled = [re.compile(regex) for regex, _ in pairs]
    assert compiled[0].sub("X", "at 0x7f3a2b1c9d00>") == "at X>"


def test_docs_name_every_notebook() -> None:
    text = (ROOT / "docs/notebooks.md").read_text(encoding="utf-8")
    for name in NAMES:
        assert name in text, f"docs/notebooks.md does not name {name}"
    # The README, kept short, names the first notebook and links the page that names them all.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert NAMES[0] in readme and "(docs/notebooks.md)" in readme
