"""Checkpoint files: plain state (tensors, numbers, strings, lists, dicts) via ``torch.save``.

Loading uses ``torch.load(weights_only=True)``, so a file can never run code; a file that is not
a precision_nb checkpoint, is truncated, or holds anything but plain state is refused with a
``ValueError`` that says why.
"""

from __future__ import annotations

import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import torch

FORMAT = "precision_nb.checkpoint"
VERSION = 1
REQUIRED = ("model", "optimizer", "scaler", "counters", "rng", "plan")


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state.get("python")
    if py is not None:
        version, internal, gauss = py
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if "WeightsUnpickler" in str(exc) else (lines[0] if lines else repr(exc))


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (keys :data:`REQUIRED`) to ``path``; returns the path."""
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise ValueError(f"checkpoint state lacks {missing}; required: {list(REQUIRED)}")
    path = Path(path)
    payload = {"format": FORMAT, "version": VERSION, **state}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)  # never leave a half-written checkpoint under the real name
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint path={str(path)!r} is not a file")
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"checkpoint {str(path)!r} is corrupt or not a torch file "
            "(torch.save writes a zip archive; this file is not one)"
        )
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"checkpoint {str(path)!r} was refused: it holds objects other than plain state "
            f"(weights_only=True loading; nothing was executed): {_first_line(exc)}"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as exc:
        raise ValueError(
            f"checkpoint {str(path)!r} is corrupt or not a torch file: {exc}"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(
            f"{str(path)!r} is not a precision_nb checkpoint "
            f"(format={found!r}; expected {FORMAT!r})"
        )
    if payload.get("version") != VERSION:
        raise ValueError(
            f"checkpoint {str(path)!r} has version={payload.get('version')!r}; supported: {VERSION}"
        )
    missing = [k for k in REQUIRED if k not in payload]
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} lacks {missing}")
    return payload
