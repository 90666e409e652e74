"""Checkpoint files: plain state (tensors, numbers, strings, lists, dicts) via ``torch.save``.

A file holds a small wrapper: format, version, the SHA-256 of the payload and the payload itself
(the ``torch.save`` bytes of the state, as a uint8 tensor). Loading uses
``torch.load(weights_only=True)`` for both, so a file can never run code; a file that is not a
precision_nb checkpoint, is truncated, has a payload whose checksum does not match (a flipped bit)
or holds anything but plain state is refused with a ``ValueError`` that says why.

:func:`validate_state` checks every entry against the model and optimizer it will be loaded into
before anything is applied, so a refused checkpoint changes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import pickle
import random
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from precision_nb.core.validate import integer, number, short_repr
from precision_nb.engine.precision import SCALER_STATE_KEYS

log = logging.getLogger(__name__)

FORMAT = "precision_nb.checkpoint"
VERSION = 2  # 2: payload + SHA-256 in a wrapper; 1: the state at top level, no checksum
REQUIRED = ("model", "optimizer", "scaler", "counters", "rng", "plan")
COUNTERS = ("steps", "attempts", "microbatches")


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _python_rng(py: Any) -> tuple[Any, ...]:
    version, internal, gauss = py
    return (version, tuple(internal), gauss)


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("python") is not None:
        random.setstate(_python_rng(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if "WeightsUnpickler" in str(exc) else (lines[0] if lines else repr(exc))


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (keys :data:`REQUIRED`) to ``path``; returns the path.

    Written to a temporary file beside ``path`` and renamed, so ``path`` is never half-written;
    the temporary file is removed whatever fails.
    """
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise ValueError(f"checkpoint state lacks {missing}; required: {list(REQUIRED)}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"checkpoint path {str(path)!r} is a directory; give a file path")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    raw = buffer.getvalue()
    wrapper = {
        "format": FORMAT,
        "version": VERSION,
        "sha256": hashlib.sha256(raw).hexdigest(),
        "payload": torch.frombuffer(bytearray(raw), dtype=torch.uint8),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(wrapper, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _torch_load(source: Any, where: str, map_location: Any) -> Any:
    try:
        return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"checkpoint {where} was refused: it holds objects other than plain state "
            f"(weights_only=True loading; nothing was executed): {_first_line(exc)}"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"checkpoint {where} is corrupt or not a torch file: {exc}") from None


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (``weights_only=True``).

    Returns the state (keys :data:`REQUIRED`). The payload's SHA-256 is checked before it is read.
    """
    path = Path(path)
    where = repr(str(path))
    if not path.is_file():
        raise ValueError(f"checkpoint path={where} is not a file")
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"checkpoint {where} is corrupt or not a torch file "
            "(torch.save writes a zip archive; this file is not one)"
        )
    wrapper = _torch_load(path, where, map_location)
    if not isinstance(wrapper, dict) or wrapper.get("format") != FORMAT:
        found = wrapper.get("format") if isinstance(wrapper, dict) else type(wrapper).__name__
        raise ValueError(
            f"{where} is not a precision_nb checkpoint "
            f"(format={short_repr(found)}; expected {FORMAT!r})"
        )
    version = wrapper.get("version")
    if version == 1:
        log.warning("checkpoint %s has no checksum (version 1); reading it unverified", where)
        payload = wrapper
    elif version == VERSION:
        payload = _unwrap(wrapper, where, map_location)
    else:
        raise ValueError(
            f"checkpoint {where} has version={short_repr(version)}; supported: 1, {VERSION}"
        )
    if not isinstance(payload, dict):
        raise ValueError(f"checkpoint {where} holds {type(payload).__name__}, not a state dict")
    missing = [k for k in REQUIRED if k not in payload]
    if missing:
        raise ValueError(f"checkpoint {where} lacks {missing}")
    return payload


def _unwrap(wrapper: dict[str, Any], where: str, map_location: Any) -> Any:
    data = wrapper.get("payload")
    expected = wrapper.get("sha256")
    ok = isinstance(data, torch.Tensor) and data.dtype == torch.uint8
    if not ok or not isinstance(expected, str):
        raise ValueError(f"checkpoint {where} is corrupt: its payload or checksum is missing")
    raw = data.cpu().numpy().tobytes()
    actual = hashlib.sha256(raw).hexdigest()
    if actual != expected:
        raise ValueError(
            f"checkpoint {where} is corrupt: the payload's SHA-256 is {actual[:16]}..., the file "
            f"says {expected[:16]}... (the data changed after it was written); nothing was loaded"
        )
    return _torch_load(io.BytesIO(raw), where, map_location)


# ----------------------------------------------------------------------------- validation


def _check_model(state: Any, model: torch.nn.Module) -> list[str]:
    if not isinstance(state, Mapping):
        return [f"model: expected a state dict, got {type(state).__name__}"]
    own = model.state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
    bad = sorted(set(own) ^ set(state))
    bad += [k for k in own if k in state and shapes.get(k) != tuple(own[k].shape)]
    if not bad:
        return []
    more = " ..." if len(bad) > 5 else ""
    return [f"model: does not fit model {type(model).__name__}: mismatched entries {bad[:5]}{more}"]


def _check_optimizer(state: Any, optimizer: torch.optim.Optimizer) -> list[str]:
    if not isinstance(state, Mapping) or not isinstance(state.get("param_groups"), list):
        return ["optimizer: expected a dict with 'state' and 'param_groups' (a list)"]
    groups, own = state["param_groups"], optimizer.param_groups
    if len(groups) != len(own):
        return [f"optimizer: {len(groups)} param groups; this optimizer has {len(own)}"]
    params: dict[Any, torch.Tensor] = {}
    for i, (theirs, mine) in enumerate(zip(groups, own, strict=True)):
        ids = theirs.get("params") if isinstance(theirs, Mapping) else None
        if not isinstance(ids, list) or len(ids) != len(mine["params"]):
            return [f"optimizer: param group {i} does not match this optimizer's parameters"]
        params.update(zip(ids, mine["params"], strict=True))
    per_param = state.get("state")
    if not isinstance(per_param, Mapping):
        return ["optimizer: 'state' must be a dict of per-parameter state"]
    for pid, entry in per_param.items():
        if pid not in params or not isinstance(entry, Mapping):
            return [f"optimizer: state for unknown parameter {short_repr(pid)}"]
        for name, value in entry.items():
            shaped = isinstance(value, torch.Tensor) and value.dim() > 0
            if shaped and value.shape != params[pid].shape:
                return [
                    f"optimizer: state {name!r} of parameter {pid} has shape "
                    f"{tuple(value.shape)}; the parameter has {tuple(params[pid].shape)}"
                ]
    return []


def _problems(checks: list[tuple[Any, ...]]) -> list[str]:
    """Run ``(check, field, value, *args)`` validators; the messages of those that fail."""
    found = []
    for check, field, value, *args in checks:
        try:
            check(field, value, *args)
        except ValueError as exc:
            found.append(str(exc))
    return found


def _check_counters(counters: Any) -> list[str]:
    if not isinstance(counters, Mapping):
        return [f"counters: expected a dict with {list(COUNTERS)}"]
    return _problems([(integer, f"counters.{k}", counters.get(k), 0) for k in COUNTERS])


def _check_scaler(state: Any) -> list[str]:
    if state is None or state == {}:  # no grad scaler state
        return []
    if not isinstance(state, Mapping) or set(state) != set(SCALER_STATE_KEYS):
        found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        return [f"scaler: keys {short_repr(found)}; expected {sorted(SCALER_STATE_KEYS)}"]
    positive = functools.partial(number, minimum=0.0, strict=True)
    checks = [(positive, "scale"), (positive, "growth_factor"), (positive, "backoff_factor")]
    checks += [(integer, "growth_interval", 1), (integer, "_growth_tracker", 0)]
    return _problems([(check, f"scaler.{key}", state[key], *args) for check, key, *args in checks])


def _check_rng(rng: Any) -> list[str]:
    if not isinstance(rng, Mapping) or "torch" not in rng:
        return ["rng: expected a dict with a 'torch' generator state"]
    problems = []
    try:
        torch.Generator().set_state(rng["torch"])  # a throwaway generator checks type and size
    except (RuntimeError, TypeError) as exc:
        problems.append(f"rng.torch: not a CPU generator state ({_first_line(exc)})")
    if rng.get("python") is not None:
        try:
            random.Random().setstate(_python_rng(rng["python"]))
        except (TypeError, ValueError) as exc:
            problems.append(f"rng.python: not a Python random state ({exc})")
    cuda = rng.get("cuda")
    if cuda is not None and not (
        isinstance(cuda, list)
        and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda)
    ):
        problems.append("rng.cuda: expected a list of uint8 tensors")
    return problems


def validate_state(
    payload: Mapping[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    where: str = "checkpoint",
) -> None:
    """``ValueError`` listing every entry of ``payload`` that cannot be loaded into ``model`` and
    ``optimizer`` (weights, optimizer state, counters, RNG state, scaler state, plan)."""
    problems = [
        *_check_model(payload.get("model"), model),
        *_check_optimizer(payload.get("optimizer"), optimizer),
        *_check_counters(payload.get("counters")),
        *_check_rng(payload.get("rng")),
        *_check_scaler(payload.get("scaler")),
    ]
    if not isinstance(payload.get("plan"), Mapping):
        problems.append("plan: expected the plan as a dict")
    if problems:
        raise ValueError(f"{where}: {'; '.join(problems)}; nothing was loaded")
