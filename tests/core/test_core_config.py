"""load_config: YAML files, YAML strings and dicts; safe loading; clear errors."""

from __future__ import annotations

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


def test_unsafe_yaml_tags_are_refused():
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config("device: !!python/object/apply:os.system ['echo hacked']\n")


def test_missing_file_and_wrong_source_type(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="expected a YAML file path"):
        load_config(42)


def test_availability_is_not_checked_at_load_time():
    # a config may be written for another machine; resolve_device checks availability later
    assert load_config("device: cuda:7\n").device == "cuda:7"
