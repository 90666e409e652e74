"""report.html and the report folder, from a hand-built comparison (no training)."""

from __future__ import annotations

import base64
import dataclasses
import re
from types import SimpleNamespace

import pytest

from precision_nb.core.events import Event
from precision_nb.views.report import html as report
from precision_nb.views.report import profile as profile_mod
from precision_nb.views.report.sections import files_of


class _Explanation:
    capabilities = None  # resolved without capabilities: no hardware hints

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __str__(self) -> str:
        return f"Precision plan: {self.mode} on cpu <explained>"

    def _repr_html_(self) -> str:
        return f'<table data-row="cpu-{self.mode}"><tr><td>applied</td></tr></table>'

    def summary(self) -> str:
        return f"{self.mode} on cpu"


@pytest.fixture
def comparison(make_result, make_comparison):
    def result(label, mode, **kw):
        return make_result(
            label,
            mode,
            explanation=_Explanation(mode),
            optimizer_outcome=SimpleNamespace(
                requested=None, probed=False, used=False, reason="probe is false off CUDA"
            ),
            events=[Event("warning", "a run event")] if mode == "bf16" else [],
            workload={"name": "mlp", "preset": "tiny", "dims": {"hidden": 100, "batch_size": 32}},
            **kw,
        )

    return make_comparison(
        fp32=result("fp32", "fp32"),
        bf16=result("bf16", "bf16"),
        drift={"bf16": {"final_loss_diff": 0.01, "param_rel_diff": 0.002}},
        merged={"fp16": "fp32"},
        events=[
            Event(
                "merged",
                "fp16 resolves to the same plan as fp32 (fp32 on cpu); run once. "
                "Why: no CPU scaler",
                {"label": "fp16", "into": "fp32", "why": "no CPU scaler"},
            ),
            Event("warning", "bf16: a run event"),
        ],
        figures={
            "fp32": {"verdict": "fp32 is the baseline.", "verdict_kind": "baseline"},
            "bf16": {
                "verdict": "bf16 is 1.50x the fp32 speed (95 % CI 1.40-1.60, 8 rounds).",
                "verdict_kind": "faster",
                "speedup_vs_fp32": 1.5,
                "speedup_ci_low": 1.4,
                "speedup_ci_high": 1.6,
            },
        },
    )


def _sections(text):
    return re.findall(r'<section id="([a-z_]+)"', text)


def test_render_html_embeds_every_figure_and_nothing_external(comparison):
    text = report.render_html(comparison, settings={"command": "precision-nb profile"})
    images = re.findall(r'data-figure="([a-z_]+)" src="data:image/png;base64,([^"]+)"', text)
    # No plan uses a loss scaler: its panel and figure are left out of the page.
    assert [stem for stem, _ in images] == ["dashboard", "loss", "throughput", "memory"]
    for _, data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG")
    assert "<script" not in text
    assert not re.search(r'(src|href)="(?!data:)', text)


def test_the_answer_comes_first_and_the_settings_last_collapsed(comparison):
    text = report.render_html(comparison, pngs={}, settings={"command": "precision-nb profile"})
    order = _sections(text)
    assert order[:3] == ["answer", "hints", "figures"] and order[-1] == "settings"
    assert '<section id="settings"><details><summary><h2>Settings</h2>' in text
    answer = text.split('<section id="answer">')[1].split("</section>")[0]
    # One card per plan, the engine's verdict first in each; the merged request below them.
    assert answer.count('class="card"') == 2
    card = answer.split('data-plan="bf16"')[1]
    verdict = "bf16 is 1.50x the fp32 speed (95 % CI 1.40-1.60, 8 rounds)."
    where = [card.index(t) for t in (verdict, "memory", "numerics", "drift from fp32")]
    assert where == sorted(where)
    assert "fp16 resolved to the same plan as fp32 (fp32 on cpu), so it was run once." in answer
    # The verdict is not repeated as a hint.
    hints = text.split('<section id="hints">')[1].split("</section>")[0]
    assert "1.50x" not in hints


def test_a_busy_machine_is_said_before_the_first_card(comparison):
    from precision_nb.engine.load import Load, LoadSample
    from precision_nb.engine.measure import MeasureConfig, Measurement

    start = LoadSample(0.0, (4.5, 4.0, 3.0), 2, 100.0, 0.0, 10.0)
    end = LoadSample(10.0, (5.1, 4.2, 3.1), 2, 115.0, 0.0, 14.0)  # others: 11 of 20 CPU-s
    measured = Measurement(MeasureConfig(), [], load=Load(start, end))
    busy = dataclasses.replace(comparison, measurement=measured)
    answer = report.render_html(busy, pngs={}).split('<section id="answer">')[1]
    assert answer.index("The machine was busy") < answer.index('class="card"')
    quiet = report.render_html(comparison, pngs={})
    assert "The machine was busy" not in quiet


def test_render_html_shows_plans_merge_summary_hints_and_events(comparison):
    text = report.render_html(comparison, pngs={})  # figures are checked above
    # Explanations are escaped text plus their own HTML matrix.
    assert "Precision plan: fp32 on cpu &lt;explained&gt;" in text
    assert 'data-row="cpu-bf16"' in text
    assert "Why: no CPU scaler" in text
    assert 'id="summary"' in text
    assert "param_rel_diff_vs_fp32" in text and "0.002" in text
    assert 'data-topic="dims"' in text and "hidden=100" in text
    assert 'data-topic="fused_adamw"' in text
    # A result event already listed by the comparison is not repeated.
    assert text.count("a run event") == 1
    assert "workload dims" in text


def test_render_html_escapes_labels(make_records):
    records = make_records("<b>x</b>", "fp32")
    text = report.render_html(records, pngs={})
    assert "<b>x</b>" not in text
    assert "&lt;b&gt;x&lt;/b&gt;" in text


def test_write_report_writes_every_output_file(comparison, tmp_path):
    files = report.write_report(comparison, tmp_path)
    assert sorted(files) == sorted(report.OUTPUT_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(report.OUTPUT_FILES)
    header = (tmp_path / "summary.csv").read_text().splitlines()[0]
    assert header.startswith("run,final_loss,")
    assert (tmp_path / "memory.png").read_bytes().startswith(b"\x89PNG")


def test_sections_are_frozen_values_and_a_file_name_is_never_used_twice(comparison):
    sections = report.report_sections(comparison, pngs={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        sections[0].title = "x"
    summary = next(s for s in sections if s.key == "summary")
    assert [f.name for f in summary.files] == ["metrics.csv", "summary.csv"]
    with pytest.raises(ValueError, match="'metrics.csv' comes from both"):
        files_of([summary, summary])


def test_a_profile_request_is_one_run_request_with_the_profiles_defaults():
    from precision_nb.core import defaults

    request = profile_mod.profile_request(compare="fp32, BF16,float16")
    assert (request.model, request.preset) == (defaults.DEFAULT_WORKLOAD, defaults.DEFAULT_PRESET)
    assert [p.requested for p in request.precisions] == ["fp32", "bf16", "fp16"]
    assert request.train.steps == defaults.DEFAULT_STEPS and request.measure.rounds is None
    assert request.analyses == ("inspect", "numerics", "time_split")
    assert request.measure.target == 0.05
    with pytest.raises(ValueError, match="at least one precision request"):
        profile_mod.profile_request(compare=" , ")
    with pytest.raises(ValueError, match="fp8"):
        profile_mod.profile_request(compare="fp8")


def test_processes_n_means_exactly_n_unless_a_budget_is_given():
    from precision_nb.core import defaults

    exact = profile_mod.profile_request(processes=3).measure
    assert (exact.processes, exact.budget_s) == (3, None)  # the default budget cuts nothing short
    assert "3 processes" in exact.describe_processes() and "no time limit" in exact.describe()
    given = profile_mod.profile_request(processes=3, budget_s=10.0).measure
    assert (given.processes, given.budget_s) == (3, 10.0)
    # a budget asked for is kept even when it equals the default's 40 s
    asked = profile_mod.profile_request(processes=3, budget_s=40.0).measure
    assert (asked.processes, asked.budget_s, asked.refuse_small_budget) == (3, 40.0, True)
    assert defaults.DEFAULT_BUDGET_S == 40.0 and repr(defaults.DEFAULT_BUDGET_S) == "40.0"
    chosen = profile_mod.profile_request().measure  # processes chosen by the target: budgeted
    assert (chosen.processes, chosen.budget_s) == (None, defaults.DEFAULT_BUDGET_S)


def test_rounds_above_the_steps_are_refused_naming_both(tmp_path):
    with pytest.raises(ValueError) as info:  # profile(steps=4, rounds=6) measured 4 rounds once
        profile_mod.profile("mlp", preset="tiny", steps=4, rounds=6, out=tmp_path / "o")
    assert "rounds: invalid value 6 with steps=4" in str(info.value)
    assert "rounds at most 4, or steps of at least 6" in str(info.value)
    assert not (tmp_path / "o").exists()
