"""load_config: YAML files, YAML strings and dicts; safe loading; clear errors."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from precision_nb import OptimizerConfig, PrecisionConfig, RunConfig, load_config

FULL = """
device: CUDA:1
precision:
  mode: Auto
  dtype: float16
  loss_scale_lab: false
optimizer:
  lr: 3e-4
  betas: [0.9, 0.95]
  eps: 1.0e-8
  weight_decay: 0.1
  fused: true
"""


def _check_full(cfg: RunConfig) -> None:
    assert cfg.device == "cuda:1"
    assert cfg.precision == PrecisionConfig("auto", "fp16")
    assert cfg.optimizer == OptimizerConfig(3e-4, (0.9, 0.95), 1e-8, 0.1, True)


def test_yaml_string():
    _check_full(load_config(FULL))


def test_yaml_file_as_str_and_path(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(FULL)
    _check_full(load_config(str(path)))
    _check_full(load_config(path))


def test_dict_with_torch_dtype_objects():
    cfg = load_config({"precision": {"mode": torch.bfloat16}, "device": torch.device("cpu")})
    assert cfg.precision.mode == "bf16" and cfg.device == "cpu"


def test_spec_examples():
    assert load_config("precision:\n  mode: auto\n  dtype: fp16\n").precision.requested == "fp16"
    assert load_config("precision:\n  mode: fp32\n  dtype: bf16\n").precision.requested == "fp32"
    for text, fused in [("null", None), ("true", True), ("false", False)]:
        assert load_config(f"optimizer:\n  fused: {text}\n").optimizer.fused is fused


def test_empty_and_partial_configs_use_defaults():
    assert load_config("") == RunConfig()
    assert load_config({}) == RunConfig()
    assert load_config({"precision": None}).precision == PrecisionConfig()


def test_device_section_form():
    assert load_config("device:\n  requested: mps\n").device == "mps"


@pytest.mark.parametrize(
    "source,words",
    [
        ("precison:\n  mode: bf16\n", ["'precison'", "'device'", "'precision'", "'optimizer'"]),
        ("precision:\n  mod: bf16\n", ["config.precision", "'mod'", "'mode'", "'dtype'"]),
        ("optimizer:\n  momentum: 0.9\n", ["config.optimizer", "'momentum'", "'fused'"]),
        ("device:\n  kind: cuda\n", ["config.device", "'kind'", "'requested'"]),
    ],
)
def test_unknown_keys_are_named_with_the_allowed_ones(source, words):
    with pytest.raises(ValueError) as err:
        load_config(source)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "source,words",
    [
        ("precision:\n  mode: fp8\n", ["precision.mode", "'fp8'", "'bf16'"]),
        ("precision:\n  mode: half precision\n", ["precision.mode", "'half precision'"]),
        ("precision:\n  mode: 16\n", ["precision.mode", "16"]),
        ("precision:\n  dtype: fp8\n", ["precision.dtype", "'fp8'"]),
        ('optimizer:\n  fused: "yes"\n', ["optimizer.fused", "'yes'", "true (attempt)"]),
        ("device: 3\n", ["config.device", "3", "'cuda'"]),
        ("device: [cuda]\n", ["config.device", "['cuda']"]),
        ("device: gpu\n", ["config.device", "'gpu'"]),
        ("precision: bf16\n", ["config.precision", "'bf16'", "mapping"]),
        ("- just\n- a list\n", ["config", "mapping"]),
        ("precision: [unclosed\n", ["not valid YAML"]),
    ],
)
def test_bad_values_name_field_value_and_allowed(source, words):
    with pytest.raises(ValueError) as err:
        load_config(source)
    for word in words:
        assert word in str(err.value)


def test_missing_file_and_wrong_source_type(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="expected a YAML file path"):
        load_config(42)


def test_availability_is_not_checked_at_load_time():
    # a config may be written for another machine; resolve_device checks availability later
    assert load_config("device: cuda:7\n").device == "cuda:7"


# --- hostile and malformed documents --------------------------------------------------------

_NAMES = "abcdefghi"
_LEVELS = [f"    - &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in itertools.pairwise(_NAMES)]
ALIAS_BOMB = "precision:\n  mode:\n    - &a [" + ", ".join(["lol"] * 9) + "]\n" + "".join(_LEVELS)


def test_alias_bomb_is_refused_quickly_without_expanding():
    assert len(ALIAS_BOMB) < 600  # 9**9 strings once expanded
    start = time.perf_counter()
    with pytest.raises(ValueError, match="expands to more than 10000 YAML nodes") as err:
        load_config(ALIAS_BOMB)
    assert time.perf_counter() - start < 2.0
    assert len(str(err.value)) < 300


def test_alias_bomb_in_a_file_is_refused_too(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    with pytest.raises(ValueError, match="bomb.yaml"):
        load_config(path)


def test_a_few_aliases_are_still_fine():
    text = "optimizer:\n  betas: &b [0.9, 0.95]\nprecision: &p {mode: bf16}\n"
    assert load_config(text).precision.mode == "bf16"


def test_recursive_alias_and_deep_nesting_are_refused():
    with pytest.raises(ValueError, match="recursive"):
        load_config("precision: &a {mode: *a}\n")
    with pytest.raises(ValueError, match="nested more than 32 levels"):
        load_config("precision: " + "[" * 500 + "]" * 500 + "\n")


def test_a_huge_value_is_shown_bounded():
    with pytest.raises(ValueError, match="precision.mode") as err:
        load_config({"precision": {"mode": "x" * 100_000}})
    assert len(str(err.value)) < 400
    with pytest.raises(ValueError, match="config.precision") as err:
        load_config({"precision": list(range(100_000))})
    assert len(str(err.value)) < 400


@pytest.mark.parametrize(
    "text,line,column,words",
    [
        ("precision:\n  mode: [bf16\n", 3, 1, "expected ',' or ']'"),
        ("precision:\n  mode: 'bf16\n", 3, 1, "unexpected end of stream"),
        ("precision:\n  mode: bf16\n bad: x\n", 3, 2, "expected <block end>"),
    ],
)
def test_malformed_yaml_file_names_file_line_column_and_expectation(
    tmp_path, text, line, column, words
):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_config(path)
    message = str(err.value)
    assert "broken.yaml" in message and "not valid YAML" in message
    assert f"line {line}, column {column}" in message
    assert words in message


def test_directory_and_missing_file_say_so(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        load_config(str(tmp_path))
    with pytest.raises(IsADirectoryError, match="is a directory"):
        load_config(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_config(tmp_path / "nope.yml")
    with pytest.raises(FileNotFoundError, match="not found") as err:
        load_config("my-run-config")  # one word, no file: not "got str"
    assert "got str" not in str(err.value)


@pytest.mark.parametrize(
    "tag",
    [
        "!!python/object/apply:os.system ['touch {marker}']",
        "!!python/object/new:os.system ['touch {marker}']",
        "!!python/name:os.system",
        "!!python/module:os",
    ],
)
def test_no_yaml_tag_runs_code(tmp_path, tag):
    marker = tmp_path / "ran"
    with pytest.raises(ValueError, match="YAML tag refused"):
        load_config("device: " + tag.format(marker=marker) + "\n")
    assert not marker.exists()
