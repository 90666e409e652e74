"""What each rank does differently: its slice of the global batch, the model wrapped in DDP or
sharded by FSDP2 (``fully_shard`` with a ``MixedPrecisionPolicy``), and its tensors' bytes by dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from precision_nb.core.plan import TORCH_DTYPES
from precision_nb.engine.distributed.counting import dtype_name


def batch_samples(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (None without one)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    items = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(items, (tuple, list)) or isinstance(batch, Mapping):
        return next((n for n in map(batch_samples, items) if n is not None), None)
    return None


def check_divisible(
    samples: int | None, nproc: int, where: str = "the global batch", nnodes: int = 1
) -> None:
    """``ValueError`` unless ``samples`` splits into ``nnodes * nproc`` equal slices."""
    world = nnodes * nproc
    if samples is not None and samples % world:
        by = (
            f"distributed.nproc={nproc}"
            if nnodes == 1
            else f"distributed.nnodes x nproc = {nnodes} x {nproc} = {world}"
        )
        raise ValueError(
            f"{where} has {samples} samples, not divisible by {by}; "
            f"allowed: a global batch size that is a multiple of {world} (each rank trains "
            f"batch/{world if nnodes > 1 else 'nproc'} samples), e.g. "
            f"{max(world, samples - samples % world)}"
        )


def rank_slice(batch: Any, rank: int, world: int) -> Any:
    """This rank's 1/world slice of every tensor of a global batch (along dimension 0)."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            return batch
        n = batch.shape[0]
        check_divisible(n, world)
        size = n // world
        return batch[rank * size : (rank + 1) * size]
    if isinstance(batch, tuple):
        items = [rank_slice(b, rank, world) for b in batch]
        return tuple(items) if type(batch) is tuple else type(batch)(*items)
    if isinstance(batch, list):
        return [rank_slice(b, rank, world) for b in batch]
    if isinstance(batch, Mapping):
        return {k: rank_slice(v, rank, world) for k, v in batch.items()}
    return batch


class RankBatches:
    """Callable batch source: microbatch ``i`` is this rank's slice of global batch ``i``."""

    def __init__(self, source: Any, rank: int, world: int) -> None:
        from precision_nb.engine.batches import BatchSource

        self.source = source if isinstance(source, BatchSource) else BatchSource(source)
        self.rank, self.world = rank, world

    def __call__(self, index: int) -> Any:
        return rank_slice(self.source.get(index), self.rank, self.world)


def _gloo_bf16_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
    """torch's ``bf16_compress_hook`` under another name.

    DDP refuses that hook by name unless CUDA with NCCL >= 2.10 is present, a guard for NCCL
    versions without bf16; gloo all-reduces bf16 tensors on CPU, so on gloo it runs as is.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(state, bucket)


def wrap_model(model: nn.Module, spec: dict[str, Any], group: Any, device: torch.device) -> Any:
    """DDP (with the requested comm hook) or FSDP2 over ``group``; the model is on ``device``."""
    model.to(device)
    if spec["strategy"] == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group)
        hook = spec.get("comm_hook") or "none"
        if hook != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as hooks

            fn = hooks.bf16_compress_hook if hook == "bf16" else hooks.fp16_compress_hook
            if hook == "bf16" and spec.get("backend") == "gloo":
                fn = _gloo_bf16_hook
            ddp.register_comm_hook(group, fn)
        return ddp
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = DeviceMesh.from_group(group, device.type)
    dtypes = {k: spec.get(k) for k in ("param_dtype", "reduce_dtype", "output_dtype")}
    policy = MixedPrecisionPolicy(**{k: TORCH_DTYPES[v] if v else None for k, v in dtypes.items()})
    _shard_blocks(model, lambda m: fully_shard(m, mesh=mesh, mp_policy=policy))
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _shard_blocks(module: nn.Module, shard: Any) -> None:
    """Shard each child with parameters of the outermost ``Sequential`` / ``ModuleList``
    containers (the usual "blocks"), without descending into what was sharded."""
    container = isinstance(module, (nn.Sequential, nn.ModuleList))
    for child in module.children():
        if container and any(p.requires_grad for p in child.parameters()):
            shard(child)
        else:
            _shard_blocks(child, shard)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (a DTensor's local shard)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def bytes_by_dtype(tensors: Any) -> dict[str, int]:
    """Bytes of this rank's share of ``tensors`` by dtype (sharded sizes for DTensors)."""
    out: dict[str, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            local = local_tensor(t)
            key = dtype_name(local.dtype)
            out[key] = out.get(key, 0) + local.numel() * local.element_size()
    return out


def sharding_summary(params: list[torch.Tensor]) -> dict[str, Any]:
    """How this rank holds its parameters: DTensor shards or full tensors, and their dtypes."""
    return {
        "parameters": len(params),
        "dtensor_parameters": sum(callable(getattr(p, "to_local", None)) for p in params),
        "local_numel": sum(local_tensor(p).numel() for p in params),
        "global_numel": sum(p.numel() for p in params),
        "master_dtypes": sorted({dtype_name(local_tensor(p).dtype) for p in params}),
    }


def observe_compute(model: nn.Module, into: dict[str, Any]) -> None:
    """On the first forward of the first module owning a ``weight``: the weight's class and dtype
    as the module computes with it (FSDP2's unsharded, cast parameter) and the output dtype."""
    owner = next(
        (x for x in model.named_modules() if torch.is_tensor(getattr(x[1], "weight", None))), None
    )
    if owner is None:
        return
    name, module = owner

    def pre(mod: nn.Module, _args: Any) -> None:
        into.update(
            module=name,
            weight_class=type(mod.weight).__name__,
            weight_dtype=dtype_name(mod.weight.dtype),
        )

    def post(_mod: nn.Module, _args: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            into["output_dtype"] = dtype_name(out.dtype)
        handles[0].remove()
        handles[1].remove()

    # prepend: run next to FSDP2's own hooks, while the parameters are unsharded
    handles = [
        module.register_forward_pre_hook(pre),
        module.register_forward_hook(post, prepend=True),
    ]
