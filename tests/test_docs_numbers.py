"""Sentences in docs/ that depend on a number or a list are checked against where it comes from
(the code's tables, the running torch), so they cannot go stale."""

from __future__ import annotations

import re
from pathlib import Path

from precision_nb.engine import metrics

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _text(page: str) -> str:
    return (DOCS / page).read_text()


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def test_training_md_lists_every_gpu_peak_of_the_table_with_its_numbers():
    rows = {}
    for line in _text("training.md").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in metrics.GPU_PEAK_TFLOPS:
            rows[cells[0]] = cells[1:]
    expected = {
        key: [_cell(peaks.get(d)) for d in ("bfloat16", "float16", "tf32", "float32")]
        for key, peaks in metrics.GPU_PEAK_TFLOPS.items()
    }
    assert rows == expected


def test_the_cpu_peak_method_is_told_with_the_sizes_and_repeats_it_uses():
    sizes = ", ".join(map(str, metrics.CALIBRATION_SIZES))
    training = _text("training.md")
    assert f"`metrics.CALIBRATION_SIZES` ({sizes};" in training
    assert f"`metrics.CALIBRATION_REPEATS` ({metrics.CALIBRATION_REPEATS}) repeats" in training
    assert not re.search(r"\d+×\d+ matmul is timed once", training)
    profiling = _text("profiling.md")
    assert f"the best size is timed {metrics.CALIBRATION_REPEATS} times" in profiling


def test_numerics_md_keeps_weight_gradients_outside_the_fp8_recipes():
    from precision_nb.engine.numerics import fp8

    text = " ".join(_text("numerics.md").split())
    assert "exactly torchao.float8's default recipe" not in text
    for role in (fp8.RECIPE, fp8.OTHER_FORMAT, fp8.OUTSIDE):
        assert f"`{role}`" in text
    assert "neither torchao.float8 nor Transformer Engine casts weight gradients to fp8" in text


def test_plans_md_says_what_plain_adamw_is_and_leaves_its_cost_to_the_measurement():
    from precision_nb.core.optim import plain_adamw_kind

    text = " ".join(_text("plans.md").split())
    assert "no slower on others" not in text and "several times slower" not in text
    assert f"its {plain_adamw_kind('cuda')} implementation on CUDA" in text
    assert f"its {plain_adamw_kind('cpu')} implementation on a CPU" in text


def test_plans_md_gives_mps_fp32_as_this_project_s_rule():
    text = _text("plans.md")
    assert "MPS runs fp32" not in text
    row = "| `mps-auto` | MPS | auto | fp32 | no | no | mixed | listed | this project's rule"
    assert row in text


def test_training_md_says_one_thing_about_when_the_lr_schedule_advances():
    text = " ".join(_text("training.md").split())
    assert "advances once per optimizer attempt" not in text
    assert "advance on counted steps only: a skipped attempt does not move the LR" in text
    assert "It advances on counted steps only: a skipped attempt does not move the LR" in text


def test_panel_md_does_not_call_the_mps_reading_an_allocator_peak():
    import inspect

    from precision_nb.engine.metrics import MemoryProbe

    # what the probe does on MPS: samples the current allocation and keeps the largest
    source = inspect.getsource(MemoryProbe.read)
    assert "torch.mps.current_allocated_memory()" in source and "max(self._peak" in source
    text = " ".join(_text("panel.md").split())
    assert "on CUDA and MPS it is the allocator's peak" not in text
    assert "the largest `torch.mps.current_allocated_memory()` read at the logging points" in text


def test_plans_md_names_every_compile_mode_torch_lists():
    import torch._inductor

    text = _text("plans.md")
    for mode in torch._inductor.list_mode_options():
        assert f"`{mode}`" in text, mode
    assert "`max_autotune_conv_backends`" in text


def test_every_hardware_preset_is_in_the_docs_tables():
    from precision_nb.core.capabilities import PRESETS

    section = _text("plans.md").split("## Hardware presets", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.M)) == set(PRESETS)
    simulate = next(line for line in _text("cli.md").splitlines() if "`--simulate PRESET`" in line)
    assert set(re.findall(r"`([a-z0-9-]+)`", simulate)) >= set(PRESETS)
