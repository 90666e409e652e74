"""`precision-nb profile` end to end on a tiny preset, and every bad input (exit 2, no writes)."""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import pytest

from precision_nb.cli.main import build_parser, main
from precision_nb.cli.profile import budget_of
from precision_nb.core.defaults import DEFAULT_BUDGET_S
from precision_nb.views.report import folder
from precision_nb.views.report.html import OUTPUT_FILES
from precision_nb.views.report.tables import SUMMARY_COLUMNS

#: The engine's comparison, replaced by a fake where a test needs no measurement.
COMPARE = "precision_nb.engine.compare.run_comparison"

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURE_FILES = ("dashboard.png", "loss.png", "loss_scale.png", "throughput.png", "memory.png")
# Two plans ran (fp32, bf16): their inspections, and the numerics of the MLP (ReLU: activation
# gradients are covered, so the activation heat map is there too).
INSPECTION_FILES = (
    "inspection_memory.csv",
    "inspection_ops.csv",
    "inspection_memory.png",
    "inspection_ops_fp32.png",
    "inspection_ops_bf16.png",
)
NUMERICS_FILES = (
    "numerics.csv",
    "numerics_gradient_underflow.png",
    "numerics_activation_underflow.png",
    "numerics_scale_window.png",
)


def _profile(*args: str) -> int:
    return main(["profile", "--no-progress", *args])


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("profile") / "out"
    # CPU on every machine, so fp16 always resolves to fp32 and is merged. The default
    # measurement (fresh processes until the target) with a shorter budget for the test.
    code = _profile(
        "--preset", "tiny", "--steps", "4", "--device", "cpu", "--budget", "30", "--out", str(out)
    )  # fmt: skip
    return out, code


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_profile_writes_every_file(profiled):
    out, code = profiled
    assert code == 0
    expected = (*OUTPUT_FILES, *INSPECTION_FILES, *NUMERICS_FILES, "time_by_family.csv")
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)
    # Nothing staged is left beside the output folder, which has the usual permissions.
    assert [p.name for p in out.parent.iterdir()] == ["out"]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask


def test_time_by_family_csv_splits_each_plan_and_sets_it_against_the_baseline(profiled):
    from precision_nb.engine.time_split import FAMILIES

    rows = _rows(profiled[0] / "time_by_family.csv")
    runs = list(dict.fromkeys(r["run"] for r in rows))
    assert runs == ["fp32", "bf16"]  # fp16 resolved to fp32 and was merged: no plan of its own
    for run in runs:
        mine = [r for r in rows if r["run"] == run]
        assert [r["family"] for r in mine] == list(FAMILIES)
        total = sum(float(r["ms_per_step"]) for r in mine)
        assert total == pytest.approx(float(mine[0]["step_ms"]), rel=1e-6)
        assert float(mine[0]["measured_median_ms"]) > 0
    bf16 = [r for r in rows if r["run"] == "bf16"]
    assert all(r["baseline"] == "fp32" and r["change_ms"] != "" for r in bf16)
    assert float(bf16[0]["reconstructed_speedup"]) > 0 and bf16[0]["agrees"] in ("True", "False")
    page = (profiled[0] / "report.html").read_text(encoding="utf-8")
    assert '<section id="time-split"' in page and "bf16 " in page


def test_metrics_csv_has_the_record_columns_and_one_row_per_step(profiled):
    from precision_nb.engine.results import RECORD_KEYS

    rows = _rows(profiled[0] / "metrics.csv")
    assert set(RECORD_KEYS) <= set(rows[0])
    # fp16 on CPU resolves to fp32, so two plans ran, four logged steps each.
    assert sorted({r["run"] for r in rows}) == ["bf16", "fp32"]
    assert [r["step"] for r in rows if r["run"] == "bf16"] == ["1", "2", "3", "4"]
    assert {r["memory_kind"] for r in rows} == {"host_rss"}


def test_summary_csv_has_one_row_per_plan(profiled):
    rows = _rows(profiled[0] / "summary.csv")
    assert list(rows[0]) == [*SUMMARY_COLUMNS, "hints"]
    by_run = {r["run"]: r for r in rows}
    assert set(by_run) == {"fp32", "bf16"}
    assert by_run["fp32"]["also_requested_as"] == "fp16"
    assert float(by_run["fp32"]["speedup_vs_fp32"]) == 1.0
    assert by_run["bf16"]["mode"] == "bf16"
    assert float(by_run["bf16"]["median_step_time_s"]) > 0
    # bf16 is compared with fp32, so its hints column carries its verdict (whatever it is).
    assert by_run["bf16"]["verdict"] in by_run["bf16"]["hints"]
    assert "fp32" in by_run["bf16"]["verdict"]
    # measured in this process and at least one fresh one; the row says what stopped it
    processes = int(by_run["bf16"]["processes"])
    assert processes >= 2 and f"over {processes} processes" in by_run["bf16"]["verdict"]
    assert by_run["bf16"]["stopped_by"].startswith(("target:", "budget:", "a fresh process"))


def test_figures_are_png(profiled):
    for name in FIGURE_FILES:
        data = (profiled[0] / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name


def test_report_html_is_self_contained_with_plans_and_merge_reason(profiled):
    text = (profiled[0] / "report.html").read_text(encoding="utf-8")
    images = re.findall(r'data-figure="([a-z_0-9]+)" src="data:image/png;base64,', text)
    pngs = [n for n in (*FIGURE_FILES, *INSPECTION_FILES, *NUMERICS_FILES) if n.endswith(".png")]
    # No plan scales its loss (fp16 merged into fp32 on a CPU): loss_scale.png is written (it
    # says so) but not shown.
    assert images == [n.removesuffix(".png") for n in pngs if n != "loss_scale.png"]
    assert not re.search(r'(src|href)="(https?:|file:|/)', text)
    assert "Precision plan: fp32 on cpu" in text
    assert "Precision plan: bf16 on cpu" in text
    assert "fp16 resolved to the same plan as fp32 (fp32 on cpu" in text
    assert "fp16 on CPU falls back to fp32" in text
    assert 'id="summary"' in text
    assert "measured:" in text  # hints name their measurement


def test_report_has_the_inspection_and_numerics_sections(profiled):
    out = profiled[0]
    text = (out / "report.html").read_text(encoding="utf-8")
    assert '<section id="inspection">' in text
    assert '<section id="numerics">' in text
    assert "No plan here ran with a grad scaler" in text  # fp16 merged into fp32 on a CPU
    memory = _rows(out / "inspection_memory.csv")
    assert {r["plan"] for r in memory} == {"fp32", "bf16"}
    params = {r["plan"]: r for r in memory if r["kind"] == "parameters"}
    assert float(params["fp32"]["bytes"]) == float(params["fp32"]["expected_bytes"]) > 0
    ops = _rows(out / "inspection_ops.csv")
    assert {(r["plan"], r["output"]) for r in ops if r["op"] == "addmm"} >= {("bf16", "bf16")}
    assert {r["output"] for r in ops if r["plan"] == "fp32"} == {"fp32"}
    grads = _rows(out / "numerics.csv")
    assert {"layer", "format", "underflow_fraction"} <= set(grads[0])
    assert {r["format"] for r in grads} >= {"fp16", "bf16"}


def test_no_inspect_and_no_numerics_leave_the_sections_out(tmp_path):
    out = tmp_path / "out"
    code = _profile(
        "--preset", "tiny", "--steps", "2", "--rounds", "1", "--compare", "fp32",
        "--device", "cpu", "--no-inspect", "--no-numerics", "--no-time-split", "--out", str(out),
    )  # fmt: skip
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)
    text = (out / "report.html").read_text(encoding="utf-8")
    assert '<section id="inspection"' not in text and '<section id="numerics"' not in text
    assert '<section id="time-split"' not in text
    assert "inspection_memory.png" not in text and "numerics_scale_window" not in text


def test_profile_into_an_existing_folder_keeps_other_files(
    tmp_path, capsys, monkeypatch, make_result, make_comparison
):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "report.html").write_text("previous report")
    fake = make_comparison(fp32=make_result("fp32", "fp32"))
    monkeypatch.setattr(COMPARE, lambda request, **kwargs: fake)
    code = _profile(
        "--preset", "tiny", "--steps", "2", "--compare", "fp32", "--no-inspect", "--no-numerics",
        "--out", str(out),
    )  # fmt: skip
    assert code == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "report.html").read_text() != "previous report"
    assert sorted(p.name for p in out.iterdir()) == sorted([*OUTPUT_FILES, "notes.txt"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert "wrote 8 files" in capsys.readouterr().out


# ----------------------------------------------------------------------------- bad input


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "nope"], "--workload: invalid value 'nope'"),
        (["--preset", "huge"], "allowed: 'tiny', 'small', 'medium', 'large'"),
        (["--steps", "0"], "--steps: invalid value 0"),
        (["--steps", "-3"], "--steps: invalid value -3"),
        (["--accumulation", "0"], "--accumulation: invalid value 0"),
        (["--device", "gpu"], "--device: invalid value 'gpu'; allowed: 'auto', 'cpu', 'cuda'"),
        (["--compare", ""], "give at least one precision request"),
        (["--compare", " , "], "give at least one precision request"),
        (["--compare", "fp32,fp8"], "'fp8'"),
        (["--simulate", "cuda-bf16"], "nothing can train on simulated hardware"),
        (["--simulate"], "nothing can train on simulated hardware"),
        (["--processes", "0"], "--processes: invalid value 0 (int); allowed: an integer from 1"),
        (["--target", "2"], "--target: invalid value 2.0; allowed: a relative half-width above 0"),
        (["--target", "0"], "--target: invalid value 0.0"),
        (["--budget", "-1"], "--budget: invalid value -1.0; allowed: a number of seconds above 0"),
        (["--budget", "soon"], "--budget: invalid value 'soon'; allowed: a number or none"),
        (["--processes", "two"], "--processes: invalid value 'two'; allowed: an integer or none"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    before = _snapshot(tmp_path)
    code = _profile(*args, "--out", str(tmp_path / "out"))
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err
    assert "Traceback" not in captured.err
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_output_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "report"
    target.write_text("a file")
    assert _profile("--preset", "tiny", "--out", str(target)) == 2
    assert f"--out: {str(target)!r} exists and is not a folder" in capsys.readouterr().err
    assert target.read_text() == "a file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_output_below_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert _profile("--preset", "tiny", "--out", str(tmp_path / "file" / "out")) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_output_not_writable_is_refused(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    # The suite may run as root, where permission bits do not stop writes; ask os.access instead.
    monkeypatch.setattr(folder.os, "access", lambda path, mode: Path(path) != out)
    assert _profile("--preset", "tiny", "--out", str(out)) == 2
    assert "is not writable" in capsys.readouterr().err
    assert list(out.iterdir()) == []


def test_a_failed_run_leaves_the_folder_as_it_was(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").write_text("previous report")

    def boom(request, **kwargs):
        raise RuntimeError("bf16: loss became NaN at step 3")

    monkeypatch.setattr(COMPARE, boom)
    assert _profile("--preset", "tiny", "--out", str(out)) == 1
    assert "run failed: bf16: loss became NaN" in capsys.readouterr().err
    assert (out / "report.html").read_text() == "previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--workload",
        "--preset",
        "--compare",
        "--device",
        "--steps",
        "--accumulation",
        "--fused",
        "--loss-scale-lab",
        "--no-inspect",
        "--no-numerics",
        "--processes",
        "--target",
        "--budget",
        "--out",
    ):
        assert flag in text
    assert "--simulate" not in text


def test_the_cli_module_imports_no_heavy_library():
    import subprocess
    import sys

    code = (
        "import sys, precision_nb.cli.profile;"
        "heavy = [m for m in ('matplotlib', 'pandas', 'torch', 'ipywidgets') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_token_workload_reports_tokens_per_s_for_every_plan(tmp_path):
    out = tmp_path / "lm"
    args = ("--workload", "lm", "--preset", "tiny", "--steps", "1", "--compare", "fp32,bf16")
    args = (*args, "--processes", "1")
    assert _profile(*args, "--device", "cpu", "--out", str(out)) == 0
    by_run = {r["run"]: r for r in _rows(out / "summary.csv")}
    assert set(by_run) == {"fp32", "bf16"}
    # The second plan reuses the cached FLOP count; its tokens/s must not get lost with it.
    for row in by_run.values():
        assert float(row["tokens_per_s"]) > 0


def test_the_terminal_opens_with_one_verdict_line_per_plan_said_once(
    tmp_path, capsys, monkeypatch, make_result, make_comparison
):
    from precision_nb.core.events import Event

    verdict = "bf16 is 1.31x the fp32 speed (95 % CI 1.22-1.40, 8 rounds)."
    fake = make_comparison(
        fp32=make_result("fp32", "fp32"),
        bf16=make_result("bf16", "bf16"),
        merged={"fp32": "fp32", "bf16": "bf16", "fp16": "fp32"},
        events=[Event("merged", "m", {"label": "fp16", "why": "no CPU GradScaler path"})],
        figures={
            "fp32": {"verdict": "fp32 is the baseline.", "verdict_kind": "baseline"},
            "bf16": {"verdict": verdict, "verdict_kind": "faster", "speedup_vs_fp32": 1.31},
        },
    )
    monkeypatch.setattr(COMPARE, lambda request, **kwargs: fake)
    code = _profile(
        "--preset", "tiny", "--steps", "2", "--no-inspect", "--no-numerics",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "fp32  fp32 is the baseline."
    assert lines[1] == f"bf16  {verdict}"
    # fp16 merged into fp32: said in words, as the HTML says it
    assert lines[2] == (
        "merged: fp16 resolved to the same plan as fp32, so it was run once. "
        "Why: no CPU GradScaler path"
    )
    assert sum(verdict in line for line in lines) == 1  # not again as `verdict:` or a hint
    assert not any(line.startswith("verdict:") for line in lines)


def test_a_budget_too_small_for_one_round_is_refused_with_the_minimum(tmp_path, capsys):
    out = tmp_path / "out"
    code = _profile(
        "--preset", "tiny", "--steps", "4", "--compare", "fp32,bf16", "--device", "cpu",
        "--budget", "0.001", "--no-inspect", "--no-numerics", "--out", str(out),
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "too small for a single round" in err and "allowed: at least" in err
    assert not out.exists()


def test_too_few_rounds_in_one_process_say_so_and_give_the_raw_ratios(tmp_path, capsys):
    out = tmp_path / "out"
    code = _profile(
        "--preset", "tiny", "--steps", "4", "--rounds", "4", "--processes", "1",
        "--compare", "fp32,bf16", "--device", "cpu", "--no-inspect", "--no-numerics",
        "--out", str(out),
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0
    assert "4 rounds in one process are below the 6 rounds a 95 % interval needs" in captured.err
    by_run = {r["run"]: r for r in _rows(out / "summary.csv")}
    verdict = by_run["bf16"]["verdict"]
    assert (
        "4 round(s) in one process are too few" in verdict and "per-round speed ratios" in verdict
    )
    assert by_run["bf16"]["speedup_ci_low"] == "" and by_run["bf16"]["processes"] == "1"


def test_more_rounds_than_steps_are_refused_before_torch_loads(capsys):
    code = main(["profile", "--steps", "4", "--rounds", "6", "--out", "unused"])
    err = capsys.readouterr().err
    assert code != 0 and "--rounds: invalid value 6 with --steps=4" in err
    assert "--rounds at most 4, or --steps of at least 6" in err


def test_the_report_a_command_writes_names_flags_not_python_arguments(tmp_path):
    out = tmp_path / "r"
    args = ("--preset", "tiny", "--steps", "1", "--compare", "fp32", "--processes", "1")
    assert _profile(*args, "--no-inspect", "--no-numerics", "--out", str(out)) == 0
    page = (out / "report.html").read_text()
    assert "Fused AdamW was not used" in page  # plain AdamW on a CPU: the hint is there
    assert "--fused auto" in page and "fused=None" not in page
    table = (out / "summary.csv").read_text()  # the hints column too
    assert "--fused auto" in table and "fused=None" not in table


def test_the_default_budget_is_told_apart_from_budget_40(capsys):
    parser = build_parser()
    default = parser.parse_args(["profile"]).budget
    assert budget_of(default) is DEFAULT_BUDGET_S  # --processes N: the default cuts nothing
    asked = budget_of(parser.parse_args(["profile", "--budget", "40"]).budget)
    assert asked == 40.0 and asked is not DEFAULT_BUDGET_S
    assert budget_of(parser.parse_args(["profile", "--budget", "none"]).budget) is None
    with pytest.raises(SystemExit):
        parser.parse_args(["profile", "--help"])
    assert "none: no limit (default: 40)" in " ".join(capsys.readouterr().out.split())
