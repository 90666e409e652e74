"""The resolution rules as keyed data, and the documented table kept identical to MATRIX."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from precision_nb.core.capabilities import BF16_QUERY_RESULTS, get_capabilities
from precision_nb.core.matrix import MATRIX, ROWS, RULES, RULES_DOC, lookup, rule_key
from precision_nb.core.plan import MODES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plans.md"
BF16_PRESET = {"supported": "cuda-bf16", "unsupported": "cuda-no-bf16", "error": "cuda-bf16-error"}


def test_every_rule_names_a_row_and_every_row_is_reachable():
    assert {row_id for row_id, _ in RULES.values()} == set(ROWS)
    assert len(ROWS) == len(MATRIX)


@pytest.mark.parametrize(
    "device,request_,lab,bf16",
    list(
        itertools.product(("cuda", "cpu", "mps", "xpu"), MODES, (False, True), BF16_QUERY_RESULTS)
    ),
)
def test_every_request_has_exactly_one_rule(device, request_, lab, bf16):
    caps = get_capabilities(BF16_PRESET[bf16])
    key = rule_key(request_, lab, device, caps)
    assert key in RULES
    row, reason = lookup(request_, lab, device, caps)
    assert row.id == RULES[key][0]
    assert "{" not in reason  # every template field was filled


def test_the_lab_key_only_exists_for_cpu_fp16():
    caps = get_capabilities("cpu-only")
    assert lookup("fp16", True, "cpu", caps)[0].id == "cpu-fp16-lab"
    assert lookup("bf16", True, "cpu", caps)[0].id == "cpu-bf16"
    assert lookup("fp16", True, "mps", caps)[0].id == "mps-mixed"


def _doc_rows() -> list[list[str]]:
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## Resolution rules", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in rows]


def test_docs_table_is_the_matrix():
    yes = {True: "yes", False: "no"}
    documented = [cells[:8] for cells in _doc_rows()]
    expected = [
        [
            f"`{r.id}`", r.device, r.request, r.mode, yes[r.scaler], yes[r.autocast], r.weights,
            r.source,
        ]
        for r in MATRIX
    ]  # fmt: skip
    assert documented == expected
    assert all(cells[8] for cells in _doc_rows())  # every row says what it means


def test_the_linked_section_exists():
    path, anchor = RULES_DOC.split("#")
    assert path == "docs/plans.md"
    heading = "## " + anchor.replace("-", " ").capitalize()
    assert heading in DOCS.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "device,request_,bf16",
    list(itertools.product(("cuda", "cpu", "mps", "xpu"), ("bf16", "fp16"), BF16_QUERY_RESULTS)),
)
def test_every_true_request_has_exactly_one_rule(device, request_, bf16):
    caps = get_capabilities(BF16_PRESET[bf16])
    key = rule_key(request_, False, device, caps, "true")
    assert key in RULES
    row, reason = lookup(request_, False, device, caps, "true")
    assert row.id == RULES[key][0] and "{" not in reason
    assert row.source == ("implied" if device == "xpu" else "true")
    # the weights stay low only where the mode does
    assert (row.weights == "true") is (row.mode != "fp32")


def test_the_true_rows_leave_the_listed_rows_as_they_were():
    listed = [r for r in MATRIX if r.source == "listed"]
    assert len(listed) == 12 and all(r.weights == "mixed" for r in listed)
    assert lookup("fp16", True, "cpu", get_capabilities("cpu-only"), "true")[0].id == (
        "cpu-fp16-true"
    )  # the loss-scale lab does not apply to fp16-true
