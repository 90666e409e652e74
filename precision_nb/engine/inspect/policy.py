"""Autocast's op policy on CPU, CUDA and MPS as the running torch applies it: for a torch call or
ATen op, whether autocast runs it in low precision, in fp32, at the widest input type, or leaves
it alone.

Read from torch, not kept as a table (:mod:`.autocast_probe` measures each autocast kernel on fake
tensors), so a simulated GPU gets the policy of the torch installed here. Where a device runs,
the op trace says what really ran and the policy names *why* (an op autocast keeps in fp32).
torch's documented op lists (:mod:`.documented_policy`) are only a cross-check, shown beside.

A torch call reaches autocast as the first ATen op in its chain that has an autocast kernel, so
a trace row is looked up by its torch-level call first (``linear``, ``cross_entropy`` ->
``cross_entropy_loss``, ``__matmul__`` -> ``matmul``), then by the ATen op that ran
(``upsample_nearest2d`` under ``interpolate``, ``_log_softmax`` -> ``log_softmax``).
"""

from __future__ import annotations

from typing import Any

import torch

from precision_nb.engine.inspect.autocast_probe import (
    DISPATCH_KEYS,
    FP32,
    LOW,
    METHOD,
    PROMOTE,
    REFUSED,
    Measured,
    device_table,
    measure_name,
    overloads_by_name,
    probe_dtype,
    spellings,
)
from precision_nb.engine.inspect.documented_policy import DOCUMENTED, documented_policy_of

__all__ = [
    "FP32",
    "LOW",
    "PROMOTE",
    "REFUSED",
    "SOURCE",
    "autocast_policy",
    "cross_device_difference",
    "disagreements",
    "lookup",
    "policy_of",
    "policy_rows",
    "spellings",
]

SOURCE = f"autocast's policy, not a trace: {METHOD}; torch {torch.__version__.split('+')[0]}"


def autocast_policy(
    device_type: str, call: str | None, op: str | None = None, dtype: Any = None
) -> Measured | None:
    """What autocast does to a torch ``call`` (``"layer_norm"``) on ``device_type`` (``"cpu"``,
    ``"cuda"`` or ``"mps"``) in the installed torch, read from its dispatcher (no GPU needed).

    ``op``: the ATen op the call ran, where known (``interpolate`` runs ``upsample_nearest2d``).
    Returns a ``Measured`` (``op``: the ATen overload whose kernel applies, ``policy``: ``"lower
    precision"``, ``"float32"``, ``"widest input type"`` or ``"refused under autocast"``,
    ``evidence``: what the measurement saw), or None when autocast leaves the call alone (it runs
    in the dtype it receives). Raises ``ValueError`` for a device type without an autocast
    dispatch key.
    """
    if device_type not in DISPATCH_KEYS:
        raise ValueError(
            f"device_type: invalid value {device_type!r}; allowed: {', '.join(DISPATCH_KEYS)}"
        )
    low = probe_dtype(device_type, dtype)
    for name in spellings(call) + spellings(op):
        found = measure_name(device_type, name, low)
        if found is not None:
            return found
    return None


#: The module's earlier name for :func:`autocast_policy`.
lookup = autocast_policy


def policy_of(
    device_type: str, call: str | None, op: str | None = None, dtype: Any = None
) -> str | None:
    """``LOW``, ``FP32``, ``PROMOTE``, ``REFUSED`` or None (see :func:`autocast_policy`); None
    also for a device type without autocast."""
    if device_type not in DISPATCH_KEYS:
        return None
    found = autocast_policy(device_type, call, op, dtype)
    return found.policy if found is not None else None


def policy_rows(device_type: str, dtype: Any = None) -> list[dict[str, Any]]:
    """Every ATen overload with an autocast kernel on ``device_type``, with its measured policy.

    Columns: ``op``, ``policy``, ``dtype`` (what the op computes in: the plan's ``dtype`` for the
    low list), ``evidence`` (what the measurement saw), ``documented`` (torch's reference list for
    the op, a cross-check; None where it lists the op nowhere) and ``source``.
    """
    if device_type not in DISPATCH_KEYS:
        raise ValueError(
            f"device_type: invalid value {device_type!r}; allowed: {', '.join(DISPATCH_KEYS)}"
        )
    low = probe_dtype(device_type, dtype)
    out_dtype = {
        LOW: str(low).replace("torch.", ""),
        FP32: "float32",
        PROMOTE: "widest input",
        REFUSED: "raises",
        None: "its inputs'",
    }
    rows = []
    for m in device_table(device_type, low):
        name = m.op.removeprefix("aten::").split(".", 1)[0]
        rows.append(
            {
                "op": m.op.removeprefix("aten::"),
                "policy": m.policy,
                "dtype": out_dtype[m.policy],
                "evidence": m.evidence,
                "documented": documented_policy_of(device_type, name),
                "source": SOURCE,
            }
        )
    order = {LOW: 0, FP32: 1, PROMOTE: 2, REFUSED: 3, None: 4}
    return sorted(rows, key=lambda r: (order[r["policy"]], r["op"]))


def cross_device_difference(
    call: str | None, device_type: str, op: str | None = None
) -> str | None:
    """Where autocast keeps ``call`` in fp32 on CPU but not on CUDA, or the other way round:
    the other device's policy (``"cuda: float32"``), else None."""
    if device_type not in DISPATCH_KEYS or not (call or op):
        return None
    here = policy_of(device_type, call, op)
    for other in [d for d in ("cuda", "cpu") if d != device_type]:
        there = policy_of(other, call, op)
        if there != here and FP32 in (here, there):
            return f"{other}: {there or 'no autocast kernel'}"
    return None


def disagreements(device_type: str, dtype: Any = None) -> list[dict[str, Any]]:
    """Every op where the documented list and the measured policy differ, as rows
    (``op``, ``documented``, ``measured``, ``measured_op``): each documented name looked up as a
    trace looks up a torch call, then each op with an autocast kernel the reference names nowhere
    (or on another list)."""
    if device_type not in DOCUMENTED:
        raise ValueError(
            f"device_type: invalid value {device_type!r}; allowed: {', '.join(DOCUMENTED)} "
            "(the device types the reference documents)"
        )
    rows: dict[str, dict[str, Any]] = {}
    for policy in (LOW, FP32, PROMOTE):
        for name in sorted(DOCUMENTED[device_type][policy]):
            found = autocast_policy(device_type, name, None, dtype)
            measured = found.policy if found is not None else None
            if measured != policy:
                rows[name] = {
                    "op": name,
                    "documented": policy,
                    "measured": measured,
                    "measured_op": found.op if found is not None else None,
                }
    low = probe_dtype(device_type, dtype)
    for name in sorted(overloads_by_name(device_type)):
        found = measure_name(device_type, name, low)
        documented = documented_policy_of(device_type, name)
        if found is not None and found.policy != documented and name not in rows:
            rows[name] = {
                "op": name, "documented": documented, "measured": found.policy,
                "measured_op": found.op,
            }  # fmt: skip
    return list(rows.values())
