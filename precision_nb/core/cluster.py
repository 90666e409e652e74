"""What-if hardware for distributed plans, and predictions made from a plan (not measurements).

``CLUSTER_PRESETS`` name clusters to explore without having them ("8xH100 NVLink"); their link
bandwidths are datasheet figures, labelled as such. ``expected_comm_bytes`` predicts the bytes a
step sends from the plan and the parameter count; ``ring_seconds`` turns bytes into a
bandwidth-only ring estimate (no latency, no overlap with compute).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from precision_nb.core.capabilities import Capabilities, get_capabilities

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class ClusterPreset:
    """Hardware to explore without having it; every figure is a datasheet value, not measured."""

    name: str
    capabilities: str
    devices: int
    device_name: str
    compute_capability: tuple[int, int] | None
    interconnect: str
    link_gb_per_s: float | None  # per GPU, one direction, datasheet
    source: str


CLUSTER_PRESETS: dict[str, ClusterPreset] = {
    p.name: p
    for p in (
        ClusterPreset(
            "8xH100 NVLink", "cuda-bf16", 8, "NVIDIA H100 80GB HBM3", (9, 0),
            "NVLink 4 through NVSwitch", 450.0,
            "datasheet: 900 GB/s bidirectional NVLink per H100 SXM GPU",
        ),
        ClusterPreset(
            "8xA100 NVLink", "cuda-bf16", 8, "NVIDIA A100-SXM4-80GB", (8, 0),
            "NVLink 3 through NVSwitch", 300.0,
            "datasheet: 600 GB/s bidirectional NVLink per A100 SXM GPU",
        ),
        ClusterPreset(
            "4xT4 PCIe", "cuda-bf16-emulated", 4, "Tesla T4", (7, 5), "PCIe Gen3 x16", 15.75,
            "PCIe Gen3 x16 specification: 15.75 GB/s per direction",
        ),
        ClusterPreset(
            "4xCPU gloo", "cpu-only", 0, "CPU", None, "loopback TCP (gloo)", None,
            "no datasheet figure: loopback speed depends on the machine",
        ),
    )
}  # fmt: skip


def cluster_capabilities(preset: ClusterPreset) -> Capabilities:
    """The simulated capabilities of a cluster preset (its device count and name)."""
    base = get_capabilities(preset.capabilities)
    extra: dict[str, Any] = {}
    if base.cuda_available:
        extra = dict(
            cuda_device_count=preset.devices,
            device_name=preset.device_name,
            compute_capability=preset.compute_capability,
        )
    return replace(base, name=preset.name, description=f"{preset.name} (simulated)", **extra)


def expected_comm_bytes(plan: Any, params: int) -> dict[str, dict[str, int]]:
    """Model-based bytes per optimizer step by op and dtype of a DistributedPlan with ``params``
    parameters.

    A prediction from the plan (buffer sizes in the convention of the counting layer: the full
    buffer of each collective), not a measurement: DDP all-reduces every gradient once; FSDP2
    all-gathers parameters for forward and again for backward (an upper bound: the root
    module keeps its parameters gathered from forward to backward) and reduce-scatters gradients.
    """
    if plan.strategy == "ddp":
        dtype = plan.comm_hook if plan.comm_hook in ("bf16", "fp16") else "fp32"
        return {"all_reduce": {dtype: params * _BYTES[dtype]}}
    param = plan.param_dtype or "fp32"
    reduce = plan.reduce_dtype or "fp32"
    return {
        "all_gather": {param: 2 * params * _BYTES[param]},
        "reduce_scatter": {reduce: params * _BYTES[reduce]},
    }


def ring_seconds(op: str, nbytes: float, nproc: int, link_gb_per_s: float) -> float:
    """Bandwidth-only ring estimate of one collective's time (no latency, datasheet link)."""
    factor = 2.0 if op == "all_reduce" else 1.0
    return factor * (nproc - 1) / nproc * nbytes / (link_gb_per_s * 1e9)
