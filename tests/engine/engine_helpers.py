"""Helpers for the engine tests."""

from __future__ import annotations

from precision_nb.engine.trainer import TrainConfig


def quiet(**kw):
    """A TrainConfig for tests: no progress bar, no CPU peak calibration."""
    kw.setdefault("progress", False)
    kw.setdefault("measure_peak", False)
    return TrainConfig(**kw)
