"""Inspection of one training step: memory by kind and dtype, and an op-by-op dtype trace.

- :mod:`.step` runs one instrumented step on a copy of the model (:func:`run_inspection`);
- :mod:`.memory` reads bytes by kind and dtype from the tensors, with hand arithmetic beside;
- :mod:`.op_trace` records every ATen op with its dtypes and FLOPs (:class:`OpTracer`);
- :mod:`.policy` keeps torch's documented autocast op lists (documented policy, not a trace).
"""

from __future__ import annotations

from precision_nb.engine.inspect.op_trace import Flag, OpTracer
from precision_nb.engine.inspect.step import InspectionData, run_inspection

__all__ = ["Flag", "InspectionData", "OpTracer", "run_inspection"]
