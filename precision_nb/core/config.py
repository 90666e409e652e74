"""Run configuration from a YAML file, a YAML string or a dict (safe YAML loading only).

```yaml
device: auto            # or cpu, cuda, cuda:1, mps; or a section {requested: cuda}
precision:
  mode: auto            # auto | fp32 | bf16 | fp16 (float32/bfloat16/float16/half accepted)
  dtype: fp16           # counts only when mode is auto
  loss_scale_lab: false
  weights: mixed        # mixed | true (bf16/fp16 weights, gradients and optimizer state)
  remedy: none          # none | stochastic | kahan (a true plan only)
optimizer:
  lr: 1.0e-3
  betas: [0.9, 0.999]
  eps: 1.0e-8
  weight_decay: 0.01
  fused: null           # null probes, true attempts, false disables
```

Unknown sections or keys raise ``ValueError`` naming them and the allowed ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from precision_nb.core.device import normalize_device_request
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.validate import short_repr
from precision_nb.core.yaml_source import SECTIONS, read_source

__all__ = ["SECTIONS", "RunConfig", "load_config"]


@dataclass(frozen=True)
class RunConfig:
    """Device request, precision request and optimizer settings of one run."""

    device: str = "auto"
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", normalize_device_request(self.device))

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "precision": self.precision.to_dict(),
            "optimizer": self.optimizer.to_dict(),
        }


def _check_keys(where: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = [short_repr(str(k)) for k in data if k not in allowed]
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(unknown[:5])}{more}; "
            f"allowed: {', '.join(map(repr, allowed))}"
        )


def _section(name: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"config.{name}: invalid value {short_repr(value)} ({type(value).__name__}); "
            f"expected a mapping with keys {', '.join(map(repr, SECTIONS[name]))}"
        )
    _check_keys(f"config.{name}", value, SECTIONS[name])
    return dict(value)


def load_config(source: Any) -> RunConfig:
    """Load a :class:`RunConfig` from a YAML file path, a YAML string or a dict.

    A missing file raises ``FileNotFoundError``, a directory ``IsADirectoryError`` (both say so);
    bad YAML (with line and column), a YAML tag, a document that expands beyond
    :data:`MAX_NODES` nodes, unknown sections/keys and bad values raise ``ValueError`` naming the
    field, the value and what is allowed. Loading is safe: no YAML tag can construct an object.
    """
    data = read_source(source)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ValueError(
            f"config: expected a mapping with sections {', '.join(map(repr, SECTIONS))}, "
            f"got {type(data).__name__} {short_repr(data)}"
        )
    _check_keys("config", data, tuple(SECTIONS))
    device = data.get("device", "auto")
    if isinstance(device, Mapping):
        device = _section("device", device).get("requested", "auto")
    precision = PrecisionConfig(**_section("precision", data.get("precision")))
    optimizer = OptimizerConfig(**_section("optimizer", data.get("optimizer")))
    return RunConfig(
        device=normalize_device_request(device, "config.device"),
        precision=precision,
        optimizer=optimizer,
    )
