"""Inspection of one training step: memory by kind and dtype, and an op-by-op dtype trace.

- :mod:`.step` runs one instrumented step on a copy of the model (:func:`run_inspection`);
- :mod:`.memory` reads bytes by kind and dtype from the tensors, with hand arithmetic beside;
- :mod:`.op_trace` records every ATen op with its dtypes and FLOPs (:class:`OpTracer`);
- :mod:`.policy` says what autocast does to an op on CPU, CUDA or MPS, read from the running torch
  (:mod:`.autocast_probe`); :mod:`.documented_policy` keeps torch's documented lists as a
  cross-check.
"""

from __future__ import annotations

from precision_nb.engine.inspect.step import InspectionData, run_inspection

__all__ = ["InspectionData", "run_inspection"]
