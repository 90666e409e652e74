"""Why a distributed plan is what it is: the sentences behind its strategy, its nodes, FSDP2's
dtypes and DDP's gradient-compression hook (:func:`~precision_nb.core.distributed.
explain_distributed` puts them in its decisions).
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from precision_nb.core.resolution import Decision

if TYPE_CHECKING:
    from precision_nb.core.distributed import Distributed

__all__ = ["HOOK_REASONS", "STRATEGY_REASONS", "fsdp_dtypes", "nodes_reason"]


def fsdp_dtypes(
    req: Distributed, plan_mode: str, scaler: bool
) -> tuple[list[Decision], tuple[str, str, str | None, list[str]]]:
    """FSDP2's ``MixedPrecisionPolicy`` dtypes derived from the plan (param, reduce, output),
    each with its reason, and the warnings a request that departs from the plan earns."""
    decisions: list[Decision] = []
    warnings: list[str] = []
    if req.param_dtype is None:
        param = plan_mode
        why = (
            f"derived from the {plan_mode} plan: parameters are all-gathered and computed in "
            f"{plan_mode} (half the all-gather bytes and unsharded-parameter memory of fp32), "
            "while the sharded fp32 master parameters stay with the optimizer"
            if plan_mode != "fp32"
            else "derived from the fp32 plan: parameters gathered and computed in fp32"
        )
    else:
        param, why = req.param_dtype, f"param_dtype={req.param_dtype} as requested"
        if req.param_dtype != plan_mode:
            warnings.append(
                f"param_dtype {req.param_dtype} differs from the {plan_mode} plan: FSDP2 casts "
                f"the gathered parameters to {req.param_dtype} whatever autocast does"
            )
    decisions.append(Decision("param_dtype", param, why))
    if req.reduce_dtype is None:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        reduce = "fp32"
        default = {f.name: f.default for f in fields(MixedPrecisionPolicy)}["reduce_dtype"]
        why = (
            "precision_nb's default: gradient reductions in low precision lose accuracy as more "
            "ranks are summed; torch's own MixedPrecisionPolicy defaults to reduce_dtype="
            f"{default}, which reduces in the param_dtype ({param}): plain FSDP2 code gets an fp32 "
            "reduction only by passing reduce_dtype=torch.float32; set reduce_dtype='bf16' here to "
            "halve the reduce-scatter bytes"
        )
    else:
        reduce = req.reduce_dtype
        why = f"reduce_dtype={reduce} as requested"
        if reduce != "fp32":
            why += f": half the reduce-scatter bytes of fp32, summed in {reduce} across ranks"
    decisions.append(Decision("reduce_dtype", reduce, why))
    if param == "fp16" and not scaler:
        warnings.append("fp16 parameters without a grad scaler: small gradients may underflow")
    output = req.output_dtype
    why = (
        f"output_dtype={output} as requested: the module outputs are cast to it"
        if output
        else "not cast: outputs keep the compute dtype (the engine computes the loss in fp32)"
    )
    decisions.append(Decision("output_dtype", output or "unchanged", why))
    return decisions, (param, reduce, output, warnings)


#: Why each DDP gradient-compression hook does what it does.
HOOK_REASONS = {
    "none": "gradients are all-reduced in their own dtype (fp32 parameters: fp32): an fp32 sum, "
    "rounded at each addition in an order the backend chooses, divided by the world size, so "
    "the last bits can differ from a sum in another order; comm_hook='bf16' halves the bytes "
    "sent",
    "bf16": "torch's bf16_compress_hook: gradients cast to bf16 for the all-reduce, then back: "
    "half the bytes; the average keeps 8 significant bits",
    "fp16": "torch's fp16_compress_hook: half the bytes; values beyond fp16's range (65504) "
    "become inf (a grad scaler then skips the step)",
}


def nodes_reason(req: Distributed) -> str:
    """How the nodes of a request run: their agents, processes and where they start."""
    each = f"{req.nnodes} torchrun agents of {req.nproc} process(es) each, {req.world_size} ranks"
    if req.node_rank is None:
        return (
            f"{each}; every node runs on this machine, each its own agent joining the c10d "
            "rendezvous (the multi-node path rehearsed on one machine)"
        )
    return (
        f"{each}; this machine is node {req.node_rank}: its agent joins the other nodes at the "
        "rendezvous, started there with the same run file"
    )


#: What each strategy keeps on each rank and what it communicates.
STRATEGY_REASONS = {
    "ddp": "DDP: every rank holds the full model, gradients are all-reduced after backward "
    "(memory per rank as on one device)",
    "fsdp2": "FSDP2 (fully_shard): parameters, gradients and optimizer state sharded across "
    "ranks; parameters all-gathered for forward and backward, gradients reduce-scattered",
}
