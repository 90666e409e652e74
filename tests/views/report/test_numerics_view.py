"""precision_nb.numerics() / Numerics: frames, figures, HTML, the run overlay."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import precision_nb
from precision_nb.views.report.numerics import Numerics
from precision_nb.views.report.numerics_figures import MAX_ROWS, underflow_heatmap


@pytest.fixture(scope="module")
def analysed():
    history = [
        {"step": i, "attempt": i, "loss_scale": s, "skipped": s == 2.0**10}
        for i, s in enumerate([2.0**10, 2.0**9, 2.0**9, 2.0**26], start=1)
    ]
    run = SimpleNamespace(scale_history=history, label="fp16")
    return precision_nb.numerics("mlp", preset="tiny", device="cpu", run=run)


def test_public_names_and_frames(analysed):
    assert isinstance(analysed, precision_nb.Numerics)
    grads = analysed.gradients
    assert {"layer", "variant", "underflow_fraction", "zeros", "status"} <= set(grads.columns)
    # the run's last scale (2^26) is the fp16 "at scale" column
    assert "fp16 x2^26" in set(grads["variant"])
    assert len(analysed.scale_window) == 25 and not analysed.stagnation.empty
    assert set(analysed.fp8["tensor"]) == {"weight", "weight_grad", "activation", "activation_grad"}
    assert not analysed.activations.empty


def test_window_counts_the_runs_attempts(analysed):
    win = analysed.window
    lo, hi = win["lo"], win["hi"]
    ks = [10, 9, 9, 26]
    expected = dict(
        attempts=4,
        below=sum(k < lo for k in ks),
        inside=sum(lo <= k <= hi for k in ks),
        above=sum(k > hi for k in ks),
    )
    assert win["run"] == expected
    assert f"on {expected['inside']} of 4 attempts" in analysed.window_text()


def test_figures_and_html(analysed):
    figs = analysed.figures()
    assert set(figs) == {"gradient_underflow", "activation_underflow", "scale_window"}
    heat = figs["gradient_underflow"].axes[0]
    assert len(heat.get_yticklabels()) == analysed.gradients["layer"].nunique()
    html = analysed._repr_html_()
    assert html.count("data:image/png;base64,") == 3
    assert "simulation" in html and "Update stagnation" in html
    # One header row per table: no extra row holding only the index name ("format", "tensor").
    for table in re.findall(r"<table>.*?</table>", html, flags=re.S):
        assert len(re.findall(r"<thead>.*?</thead>", table, flags=re.S)[0].split("<tr>")) == 2
    assert "<th>format</th><th>updated</th><th>lost</th><th>lost_fraction</th>" in html
    assert "<th>tensor</th><th>format</th><th>recipe</th><th>median rel_error</th>" in html
    assert re.search(r"Safe fp16 loss scales: 2\^\d+ to 2\^\d+", html)
    with pytest.raises(ValueError, match="which: invalid value 'weights'"):
        analysed.heatmap("weights")


def test_heatmap_marks_missing_gradients_and_caps_rows():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x):
            return self.used(x).sum()

    result = precision_nb.numerics(Branchy(), [torch.randn(3, 4)], device="cpu")
    texts = [t.get_text() for t in result.heatmap().axes[0].texts]
    assert "no grad" in texts
    rows = [
        dict(layer=f"l{i}", variant="fp16", status="ok", underflow_fraction=i / 100)
        for i in range(MAX_ROWS + 5)
    ]
    ax = underflow_heatmap(rows).axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == MAX_ROWS and "l0" not in labels and "l64" in labels
    assert f"{MAX_ROWS} of {MAX_ROWS + 5}" in ax.get_title()


def test_bad_run_is_refused():
    with pytest.raises(ValueError, match="run has type str"):
        precision_nb.numerics("mlp", run="fp16")


def test_numerics_wraps_an_engine_result_without_a_run(analysed):
    bare = Numerics(analysed.result)
    assert "run" not in bare.window
    # Without a run there is no history panel (not an empty one): the sweep alone.
    (sweep,) = bare.window_figure().axes
    assert sweep.get_ylabel() == "log2(loss scale)"


def test_window_text_gives_the_subnormal_share_and_what_was_counted(analysed):
    text = analysed.window_text()
    win = analysed.window
    assert f"at 2^{win['lo']} {win['lo_subnormal_fraction']:.1%}" in text
    counted = (
        f"the {win['counted_tensors']} of" if win["counted_tensors"] < win["tensors"] else "all"
    )
    assert f"Counted: {counted}" in text and "autocast step holds" in text
    # the threshold in the unit the docs give it in (0.1 %), not as a fraction (0.001)
    assert f"at most {win['threshold'] * 100:.2g} % of the non-zero gradients" in text
    fig = analysed.window_figure()
    left = fig.axes[0]
    labels = {line.get_label() for line in left.get_lines()}
    assert {"cast to 0", "subnormal"} <= labels
    (band,) = left.patches  # the window band: it ends at the stated edges
    assert (band.get_y(), band.get_y() + band.get_height()) == (win["lo"], win["hi"])


def test_heatmap_labels_gradients_a_real_fp16_step_keeps_in_fp32():
    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = nn.Embedding(10, 4), nn.Linear(4, 10)

        def forward(self, x):
            return self.out(self.emb(x))

    x = torch.randint(0, 10, (8, 3))
    result = precision_nb.numerics(Embed(), [(x, x)], device="cpu")
    labels = [t.get_text() for t in result.heatmap().axes[0].get_yticklabels()]
    assert labels[0].startswith("emb.weight  [") and labels[0].endswith("fp32 in fp16 run]")
    assert labels[1:] == ["out.weight", "out.bias"]


def test_a_true_runs_measured_lost_updates_show_per_layer(analysed):
    run = precision_nb.fit(
        "mlp", preset="tiny", device="cpu", precision="bf16-true", steps=4, log_every=2,
        update_stats=True, progress=False, measure_peak=False,
    )  # fmt: skip
    view = Numerics(analysed.result, run)
    lost = view.lost_updates
    names = {n for n, _ in precision_nb.get_workload("mlp", "tiny").make_model().named_parameters()}
    assert set(lost["layer"]) == names and set(lost["step"]) == {2, 4}
    assert lost["updates_rounded_away"].between(0, 1).all()
    page = view._repr_html_()
    assert "Lost updates measured on the run bf16-true (step 4, per layer)" in page
    assert Numerics(analysed.result, None).lost_updates.empty
