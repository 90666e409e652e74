"""Profile: notebook HTML, save() writing the CLI's folder, the measurement settings table."""

from __future__ import annotations

import dataclasses

import pytest
from typed_outcomes import with_outcomes

from precision_nb.engine.compare import Comparison
from precision_nb.engine.comparison import Rates
from precision_nb.engine.metrics import PeakRatio
from precision_nb.views.report.hints import hints
from precision_nb.views.report.html import OUTPUT_FILES
from precision_nb.views.report.profile_result import Profile, measurement_settings
from precision_nb.views.report.tables import summary


def _comparison(make_result):
    results = {
        label: make_result(label, label, step_time_s=t)
        for label, t in (("fp32", 0.01), ("bf16", 0.005))
    }
    return with_outcomes(
        Comparison(
            results=results,
            model_info={"class": "MLP", "params": 1234},
            peak_ratios={"bfloat16": PeakRatio(3.0, 3.0, 3.0, "measured")},
            method={"method": "warm-up until ...", "rounds": 8, "steps per block": "6"},
        ),
        {
            "fp32": {"verdict": "fp32 is the baseline.", "verdict_kind": "baseline"},
            "bf16": {
                "verdict": "bf16 is 2.00x the fp32 speed (95 % CI 1.90-2.10, 8 rounds).",
                "verdict_kind": "faster",
                "speedup_vs_fp32": 2.0,
                "speedup_ci_low": 1.9,
                "speedup_ci_high": 2.1,
                "rounds": 8,
                "warmup_steps": 4,
            },
        },
    )


def _profile(make_result) -> Profile:
    comparison = _comparison(make_result)
    hint_list = tuple(hints(comparison))
    return Profile(
        comparison, summary(comparison), hint_list, measurement_settings(comparison, hint_list)
    )


def test_settings_name_model_machine_method_and_end_with_what_to_try_next(make_result):
    settings = _profile(make_result).settings
    assert settings["model"] == "MLP (1,234 parameters)"
    assert "AVX512-BF16" in settings["CPU low-precision features"]
    assert "source:" in settings["CPU low-precision features"]
    key = "measured matmul peak vs fp32"
    assert settings[key] == "bfloat16 3.00× (measured)"


def test_settings_show_the_peak_ratio_with_its_range(make_result):
    from precision_nb.engine.metrics import PeakRatio

    comparison = _comparison(make_result)
    comparison.peak_ratios = {"bfloat16": PeakRatio(2.3, 1.9, 4.1, "measured: 5+ repeats each")}
    settings = measurement_settings(comparison, ())
    value = settings["measured matmul peak vs fp32"]
    assert value == "bfloat16 2.30×, range 1.90–4.10 (measured: 5+ repeats each)"
    assert settings["rounds"] == 8
    assert list(settings)[-1] == "what to try next"


def test_summary_takes_the_measured_interval(make_result):
    table = _profile(make_result).summary.set_index("run")
    assert table.loc["bf16", "speedup_vs_fp32"] == 2.0
    assert table.loc["bf16", "speedup_ci_low"] == 1.9 and table.loc["bf16", "warmup_steps"] == 4


def test_notebook_html_opens_with_the_verdicts_then_table_hints_and_figure(make_result):
    page = _profile(make_result)._repr_html_()
    verdict = "bf16 is 2.00x the fp32 speed (95 % CI 1.90-2.10, 8 rounds)."
    # One line per plan first (a card each), the verdict said once.
    assert page.count(verdict) == 1 and page.count('class="card"') == 2
    assert page.index("fp32 is the baseline.") < page.index(verdict) < page.index("<table")
    assert "speedup_ci_low" in page and "data:image/png;base64," in page
    assert "from: peak_ratios from measured peaks" in page  # the other hints follow
    assert "what to try next" in page


def test_save_writes_the_cli_folder_and_refuses_a_file(make_result, tmp_path):
    result = _profile(make_result)
    files = result.save(tmp_path / "new" / "out")
    assert sorted(files) == sorted(OUTPUT_FILES)
    assert result.out_dir == tmp_path / "new" / "out"
    assert "CPU low-precision features" in (tmp_path / "new" / "out" / "report.html").read_text()
    target = tmp_path / "file"
    target.write_text("keep")
    with pytest.raises(ValueError, match="^out: .* exists and is not a folder"):
        result.save(target)
    assert target.read_text() == "keep"
    assert "bf16 is 2.00x" in repr(result)


def test_throughput_figure_shows_the_measured_rate_and_interval(make_result):
    from precision_nb.views.report.figures import throughput_figure

    comparison = _comparison(make_result)
    bf16 = comparison.outcomes["bf16"]
    comparison.outcomes["bf16"] = dataclasses.replace(bf16, rates=Rates(samples_per_s=12345.0))
    ax = throughput_figure(comparison).axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert "bf16 2.00× (1.90–2.10, ±5 %)" in labels and "fp32" in labels
    flat = [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert 12345.0 in flat
    assert "warm-up excluded" in ax.get_title()


def test_a_busy_machine_is_said_before_any_figure(make_result):
    from precision_nb.engine.load import Load, LoadSample
    from precision_nb.engine.measure import MeasureConfig, Measurement

    comparison = _comparison(make_result)
    start = LoadSample(0.0, (4.5, 4.0, 3.0), 2, 100.0, 0.0, 10.0)
    end = LoadSample(10.0, (5.1, 4.2, 3.1), 2, 115.0, 0.0, 14.0)  # others: 11 of 20 CPU-s
    comparison.measurement = Measurement(MeasureConfig(), [], load=Load(start, end))
    result = Profile(comparison, summary(comparison), (), {})
    assert result.load_note.startswith("The machine was busy") and "55%" in result.load_note
    page = result._repr_html_()
    assert page.index("The machine was busy") < page.index("bf16 is 2.00x")
    assert repr(result).splitlines()[1].strip().startswith("The machine was busy")
    quiet = Load(start, start.__class__(10.0, None, 2, 101.0, 0.0, 10.5))
    comparison.measurement = Measurement(MeasureConfig(), [], load=quiet)
    assert Profile(comparison, summary(comparison), (), {}).load_note == ""  # quiet: nothing
