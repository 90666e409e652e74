"""Hostile but fair input: nothing silently wrong, nothing half-done, every error names the field.

Where each case of the hardening corpus is tested: one line per case, "FILE::test" below it. FILE
is short for: H tests/engine/test_engine_hardening.py, CK tests/engine/test_engine_checkpoint.py,
S tests/engine/test_engine_session.py, C tests/core/test_core_config.py, M tests/cli/
test_cli_main.py, P tests/cli/test_cli_plan.py, PR tests/cli/test_cli_profile.py, I tests/cli/
test_cli_inspect.py, F tests/cli/test_cli_report_folder.py, L tests/views/panel/test_lifecycle.py,
PF tests/views/panel/test_failures.py, D tests/test_docs.py, SS tests/test_setup_scripts.py,
NB tests/test_notebooks_meta.py, here this file. The tests of this file are the cases no other
file covered.

Silent wrong results
- an overflow storm (every attempt overflows) counts no step and stops at the floor
    H::test_an_overflow_storm_counts_no_step_and_stops_at_the_floor
- init_scale=inf (and nan, 0, -1, 'big') refused, in TrainConfig and make_grad_scaler
    H::test_scaler_settings_must_be_finite_and_positive
- the scale floor error names the scale, the step and what to change
    H::test_the_default_floor_names_scale_step_and_what_to_change
- no "no grad scaler to skip it" for a plan with a scaler
    H::test_a_loss_the_scaler_cannot_skip_is_not_blamed_on_a_missing_scaler
- fit("mlp", precision="fp16", device="cpu"): a fallback event and a logging warning
    H::test_a_plan_fallback_is_an_event_and_a_warning
    H::test_a_fused_adamw_fallback_is_an_event
    here::test_a_plan_fallback_shows_in_the_panels_events
- verify_autocast at every fit, a mismatch an event and a warning
    H::test_every_fit_checks_autocast_and_warns_on_a_mismatch
- a non-scalar loss_fn: names loss_fn, the shape, what is expected
    H::test_a_non_scalar_loss_fn_is_named_with_its_shape
Half-done operations
- checkpoint load is atomic: counters {'steps': 'x'}, an RNG state of the wrong size, optimizer
  state without param groups, scaler state of wrong types (or an inf scale)
    CK::test_one_bad_entry_changes_nothing
- a content checksum refuses a bit flip
    CK::test_a_flipped_bit_in_the_payload_is_refused
- no *.tmp left behind
    CK::test_saving_onto_a_directory_is_refused_and_leaves_no_tmp
    CK::test_a_failed_save_leaves_no_tmp_and_keeps_the_old_file
- Ctrl-C during precision-nb profile leaves --out as it was and exits 130
    F::test_ctrl_c_during_the_run_leaves_out_as_it_was
    F::test_a_real_ctrl_c_stops_the_run_and_keeps_the_old_report
- stale *.partial folders are removed on the next run
    F::test_stale_partial_folders_are_removed_on_the_next_run
- a full disk: what could not be written, how much space, old report kept, exit 1
    F::test_disk_full_keeps_the_old_report_and_says_what_and_how_much
- a YAML alias bomb is refused fast with a bounded message
    C::test_alias_bomb_is_refused_quickly_without_expanding
    C::test_alias_bomb_in_a_file_is_refused_too
    P::test_alias_bomb_config_is_refused_quickly
- malformed YAML: file, line, column; exit 2 without a traceback
    C::test_malformed_yaml_file_names_file_line_column_and_expectation
    P::test_malformed_config_exits_2_with_file_line_and_column
- a directory or a missing file says so
    C::test_directory_and_missing_file_say_so
    P::test_config_that_is_a_directory_says_so
Validation gaps
- make_grad_scaler(None), make_grad_scaler('fp16')
    H::test_make_grad_scaler_wants_a_plan
- make_grad_scaler(plan, init_scale=nan)
    H::test_scaler_settings_must_be_finite_and_positive
- OptimizerConfig(lr=10**400)
    H::test_huge_learning_rate_is_a_value_error
- TrainConfig(init_scale='big'), overflow_at_steps=5, min_lr_ratio=None, seed='x', seed=2**70
    H::test_bad_train_settings_name_the_field
- seed=2**70 in the panel
    PF::test_out_of_range_seed_is_refused_by_set_and_constructor
    PF::test_out_of_range_seed_typed_into_the_widget_disables_run_and_says_why
- a batches callable returning None at a later index
    H::test_batches_returning_none_later_is_named
- fit(steps=10**12), and precision-nb profile --steps 10**12
    H::test_fit_with_too_many_steps_is_refused_before_it_starts
    here::test_the_step_bound_holds_on_the_command_line_too
- a model whose forward raises SystemExit, in the panel
    PF::test_a_base_exception_in_forward_is_shown_not_swallowed
- --out . with a read-only parent
    F::test_out_dot_with_a_read_only_parent_works
    F::test_out_dot_that_is_read_only_is_refused_naming_the_folder
- switches that are not booleans, train=/callbacks=/stop=/loss_fn= of the wrong kind, panel
  values of a wrong type
    here::test_switches_must_be_booleans
    here::test_profile_switches_must_be_booleans
    here::test_train_must_be_a_train_config
    here::test_fit_hooks_of_the_wrong_kind_are_named
    here::test_compare_lab_switch_must_be_a_boolean
    here::test_panel_values_of_the_wrong_type_are_value_errors
- messages bound what they print (core.validate.short_repr)
    here::test_messages_bound_what_they_print
Resources
- Panel.close() closes widgets, drops the model, stops a run
    L::test_close_closes_every_widget_of_the_panel
    L::test_close_drops_model_and_results
    L::test_close_stops_a_running_job
- 50 panels created and dropped
    L::test_fifty_panels_created_and_dropped_leave_no_widgets_behind
- a dropped panel frees its model
    L::test_dropped_panel_frees_a_32_mib_model_even_after_a_run
The newcomer's path
- the demo's setup installs what the README runs next (jupyter lab)
    D::test_demo_setup_installs_what_the_readme_runs_next
- the CPU torch where no NVIDIA driver is present, CUDA torch where one is
    SS::test_linux_without_driver_gets_the_cpu_index
    SS::test_a_driver_gets_plain_pip_the_cuda_build
- the cell that raises on purpose carries the raises-exception tag
    NB::test_errors_only_where_marked_as_raising
- tqdm.auto in notebooks
    here::test_the_progress_bar_is_tqdm_auto
- RunResult: a short repr, and _repr_html_ with summary, events and the loss curve
    S::test_run_result_shows_a_summary_not_a_dump
    here::test_run_result_html_draws_the_loss_curve
- report.write_report() into a missing folder
    F::test_write_report_creates_a_missing_folder
- precision-nb --version
    M::test_version
- precision-nb plan --json | head -1: no traceback (a subprocess)
    M::test_a_shell_pipe_into_head_prints_one_line
    M::test_a_closed_pipe_ends_quietly
- profile --help shows the defaults
    M::test_profile_help_names_the_defaults_it_runs_with
    M::test_every_option_shows_its_default
- --device gpu says what is allowed
    P::test_bad_input_exits_2_with_a_message_and_no_traceback
    PR::test_bad_input_exits_2_and_writes_nothing
    I::test_bad_input_exits_2_with_the_field
- value errors before the torch import (plan, profile, inspect)
    M::test_a_bad_flag_is_answered_before_torch_is_imported
- no "[spec]" or "the spec's" in the package or in notebook output
    here::test_no_spec_wording_in_the_package
    here::test_no_spec_wording_in_the_notebooks
- CLI spellings in CLI output
    M::test_plan_output_uses_cli_spellings
- the LR schedule advances on counted steps only
    H::test_lr_schedule_advances_on_counted_steps_only
- the declared torch version is the tested one
    here::test_the_declared_torch_is_the_tested_one
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

import precision_nb as pnb
from precision_nb.cli.main import main as cli_main
from precision_nb.core.events import of_kind

ROOT = Path(__file__).resolve().parents[1]
HUGE = "x" * 100_000
LONG_LIST = list(range(100_000))
MAX_MESSAGE = 600


def _panel(**kwargs):
    from precision_nb.views.panel import Panel

    return Panel(**kwargs)


def _profile(**kwargs):
    return pnb.profile(out=str(ROOT / "no-such-profile-out"), **kwargs)


BOUNDED = [
    ("optimizer.betas", lambda: pnb.OptimizerConfig(betas=LONG_LIST)),
    ("optimizer.fused", lambda: pnb.OptimizerConfig(fused=HUGE)),
    ("workload", lambda: pnb.fit(HUGE)),
    ("preset", lambda: pnb.fit("mlp", preset=HUGE)),
    ("preset", lambda: pnb.inspect("mlp", preset=HUGE)),
    ("capabilities preset", lambda: pnb.get_capabilities(HUGE)),
    ("unknown train option", lambda: pnb.fit("mlp", **{HUGE: 1})),
    ("train", lambda: pnb.fit("mlp", train=HUGE)),
    ("fused", lambda: _panel(fused=HUGE)),
    ("workload", lambda: _panel(workload=HUGE)),
    ("optimizer", lambda: _panel(optimizer=HUGE)),
    ("loss_scale_lab", lambda: _panel(loss_scale_lab=HUGE)),
    ("compare_plans", lambda: _panel(compare_plans=HUGE)),
    ("plot_budget", lambda: _panel(plot_budget=HUGE)),
    ("fused", lambda: _profile(fused=HUGE)),
    ("steps", lambda: _profile(steps=LONG_LIST)),
    ("accumulation", lambda: _profile(accumulation=HUGE)),
    ("compare", lambda: _profile(modes="," * 100_000)),
    ("processes", lambda: _profile(processes=LONG_LIST)),
    ("target", lambda: _profile(target=LONG_LIST)),
    ("budget_s", lambda: _profile(budget_s=LONG_LIST)),
]


IDS = [f"{index}-{field}" for index, (field, _) in enumerate(BOUNDED)]


@pytest.mark.parametrize("field,call", BOUNDED, ids=IDS)
def test_messages_bound_what_they_print(field, call):
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert len(message) < MAX_MESSAGE and field in message and "..." in message


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(skip_nonfinite="no"), "train.skip_nonfinite"),  # a non-empty string is truthy
        (dict(progress=0), "train.progress"),
        (dict(measure_peak="yes"), "train.measure_peak"),
        (dict(label=["a"]), "train.label"),
    ],
)
def test_switches_must_be_booleans(kwargs, field):
    with pytest.raises(ValueError, match=rf"{field}: invalid value .*allowed"):
        pnb.TrainConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(loss_scale_lab="no"), dict(fused="yes")])
def test_profile_switches_must_be_booleans(kwargs, tmp_path):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=rf"^{name}: invalid value .*(True or False|true)"):
        pnb.profile(out=tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(callbacks=5), "callbacks: invalid value 5 (int); allowed: a list"),
        (dict(stop="yes"), "stop: invalid value 'yes' (str); allowed: None or a threading.Event"),
        (dict(loss_fn="mse"), "loss_fn: invalid value 'mse' (str); allowed: None or a callable"),
    ],
)
def test_fit_hooks_of_the_wrong_kind_are_named(kwargs, words):
    with pytest.raises(ValueError) as info:
        pnb.fit("mlp", steps=1, progress=False, **kwargs)
    assert words in str(info.value)


def test_compare_lab_switch_must_be_a_boolean():
    # "no" is truthy: it used to turn the lab on
    with pytest.raises(ValueError, match=r"loss_scale_lab: invalid value 'no'.*True or False"):
        pnb.compare(["fp16"], loss_scale_lab="no", steps=1, progress=False)


def test_train_must_be_a_train_config():
    with pytest.raises(ValueError, match=r"train: invalid value 'fast' \(str\); allowed: a TrainC"):
        pnb.fit("mlp", train="fast")


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(plot_budget="half"), "plot_budget"),
        (dict(workload=["mlp"]), "workload"),
        (dict(compare_plans=5), "compare_plans"),
        (dict(compare_plans=[["fp32"]]), "compare_plans"),
    ],
)
def test_panel_values_of_the_wrong_type_are_value_errors(kwargs, field):
    with pytest.raises(ValueError, match=field):
        _panel(**kwargs)


def test_the_step_bound_holds_on_the_command_line_too(capsys):
    assert cli_main(["profile", "--steps", str(10**12), "--out", "unused-out"]) == 2
    err = capsys.readouterr().err
    assert "--steps: invalid value 1000000000000" in err and "10000000" in err


def test_a_plan_fallback_shows_in_the_panels_events():
    panel = _panel(device="cpu", mode="fp16", steps=2)
    try:
        result = panel.run(block=True, timeout=120)
        fallbacks = of_kind(result.events, "fallback")
        assert [e.data["used"] for e in fallbacks] == ["fp32"]
        assert fallbacks[0].message.split(":")[0] in panel.widgets.events_html.value
    finally:
        panel.close()


def test_run_result_html_draws_the_loss_curve():
    result = pnb.fit("mlp", steps=6, log_every=2, progress=False)
    page = result._repr_html_()
    points = re.search(r"<polyline[^>]* points='([^']*)'", page)
    assert points is not None and len(points.group(1).split()) == len(result.records) == 3
    assert "loss (mean per logging interval)" in page and len(page) < 4000


def test_the_progress_bar_is_tqdm_auto():
    import tqdm.auto

    from precision_nb.engine import callbacks

    assert callbacks.tqdm is tqdm.auto.tqdm  # a widget in Jupyter, text in a terminal


# "spec" as a word: the user has no specification; "SPEC" (a placeholder) and identifiers are fine
SPEC_WORDING = re.compile(r"\[spec\]|\bspec's\b|\bthe spec\b|\bspec\b(?!\w)", re.IGNORECASE)


def _string_constants(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_no_spec_wording_in_the_package():
    found = [
        f"{path.relative_to(ROOT)}: {text[:80]!r}"
        for path in sorted((ROOT / "precision_nb").rglob("*.py"))
        for text in _string_constants(path)
        if re.search(r"\[spec\]|\bspec's\b|\bthe spec\b|\(spec\)|, spec\b", text, re.IGNORECASE)
    ]
    assert found == []


def test_no_spec_wording_in_the_notebooks():
    found = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            texts = ["".join(cell["source"])]
            for output in cell.get("outputs", []):
                texts.append("".join(output.get("text", "")))
                texts += ["".join(v) for k, v in output.get("data", {}).items() if "text" in k]
                texts.append("\n".join(output.get("traceback", [])))
            found += [f"{path.name} cell {index}" for t in texts if SPEC_WORDING.search(t)]
    assert found == []


def test_the_declared_torch_is_the_tested_one():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.search(r'"torch>=(\d+)\.(\d+)', pyproject).groups()
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    pinned = re.search(r"torch==(\d+)\.(\d+)\.\d+", setup).groups()
    running = tuple(torch.__version__.split(".")[:2])
    # the oldest version declared is the one setup installs and the tests run on
    assert declared == pinned == running
