"""precision_nb.inspect(): DataFrames, figures, the HTML section and the written folder."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import precision_nb
from precision_nb.views.report import inspection as I
from precision_nb.views.report.figures import figure_to_png
from precision_nb.views.report.inspection_figures import KIND_COLORS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plans():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    return {
        mode: precision_nb.inspect(model, [batch], mode, device="cpu") for mode in ("fp32", "bf16")
    }


def test_inspect_is_a_public_lazy_name():
    assert precision_nb._EXPORTS["inspect"] == "precision_nb.views.report.inspection"
    assert precision_nb.inspect is I.inspect and precision_nb.Inspection is I.Inspection


def test_memory_frame_has_measured_and_expected_bytes(plans):
    frame = plans["bf16"].memory
    assert list(frame.columns) == I.MEMORY_COLUMNS
    params = frame[frame["kind"] == "parameters"].iloc[0]
    assert params["bytes"] == params["expected_bytes"] == 4 * (16 * 32 + 32 + 32 * 4 + 4)
    copies = frame[frame["kind"] == "autocast weight copies"].iloc[0]
    assert copies["dtype"] == "bf16" and copies["bytes"] == params["bytes"] // 2
    assert "autocast weight copies" not in set(plans["fp32"].memory["kind"])


def test_ops_and_summary_frames(plans):
    ops = plans["bf16"].ops
    assert list(ops.columns) == I.OPS_COLUMNS
    assert ops["flops_share"].sum() == pytest.approx(1.0)
    summary = plans["bf16"].summary
    top = summary.iloc[0]
    assert top["verdict"] == "ran in bf16" and top["flops_share"] == pytest.approx(1.0)


def test_figures_draw_one_bar_per_plan_in_kind_colours(plans):
    figs = plans["bf16"].figures()
    assert set(figs) == {"memory", "ops"}
    for fig in figs.values():
        assert figure_to_png(fig).startswith(PNG_MAGIC)
    both = I.memory_breakdown_figure(plans)
    ax = both.axes[0]
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == ["fp32", "bf16"]
    colors = {p.get_facecolor()[:3] for p in ax.patches}
    from matplotlib.colors import to_rgb

    assert to_rgb(KIND_COLORS["autocast weight copies"]) in colors


def test_html_section_names_measured_and_expected_and_embeds_figures(plans):
    page = plans["bf16"]._repr_html_()
    assert page.count("<img") == 2
    assert "expected_bytes" in page and "kept in fp32 by autocast" in page
    assert "process memory (host RSS)" in page


def test_the_op_table_fits_the_page_verdicts_head_groups_of_rows(plans):
    page = I.inspection_html({"bf16": plans["bf16"]}, figures=False)
    ops = page.split('<table class="compact">')[1].split("</table>")[0]
    head = ops.split("</thead>")[0]
    assert "<th>verdict</th>" not in head and head.count("<th>") == 9
    assert "<th>inputs → output</th>" in head
    groups = re.findall(r'<tr class="group"><th colspan="9">([^<]+)</th></tr>', ops)
    assert groups[0] == "ran in bf16" and len(groups) == len(set(groups))
    assert "<td>fp32 → bf16</td>" in ops  # a cast, its dtypes in one cell


def test_simulated_device_shows_the_policy_read_from_torch(plans):
    sim = precision_nb.inspect("mlp", preset="tiny", capabilities="cuda-bf16")
    assert sim.simulated and sim.ops.empty
    assert set(sim.policy["source"]) == {sim.data.policy[0]["source"]}
    assert {"evidence", "documented"} <= set(sim.policy.columns)
    page = sim._repr_html_()
    assert "the ops table is for cuda: autocast&#x27;s policy, not a trace: measured" in page
    assert (
        "(expected, simulated)"
        in I.memory_breakdown_figure([sim]).axes[0].get_xticklabels()[0].get_text()
    )


def test_write_inspection_writes_csvs_pngs_and_html(plans, tmp_path):
    files = I.write_inspection(plans, tmp_path)
    assert {"inspection_memory.csv", "inspection_ops.csv", "inspection.html"} <= set(files)
    assert (tmp_path / "inspection_ops_bf16.png").read_bytes().startswith(PNG_MAGIC)
    import pandas as pd

    memory = pd.read_csv(tmp_path / "inspection_memory.csv")
    assert set(memory["plan"]) == {"fp32", "bf16"}
