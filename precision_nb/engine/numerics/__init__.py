"""Numerics of the user's own model: what fp16, bf16 and fp8 would do to its tensors.

``analysis.analyze`` runs one instrumented fp32 step on a deep copy and returns plain rows;
``training.grad_underflow_stats`` measures gradient underflow inside a training loop without a
host sync. The views wrap the rows as ``precision_nb.numerics()`` / ``Numerics``.
"""
