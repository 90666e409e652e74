"""The distributed request (:class:`Distributed`) and its resolution with a reason for every field.

``explain_distributed(distributed, precision, device, hardware)`` resolves the precision plan as on
one device, then the distributed fields on top of it: strategy (DDP or FSDP2), nodes and
processes, the torch.distributed backend (gloo on CPU, nccl on CUDA), FSDP2's
``MixedPrecisionPolicy`` dtypes derived from the plan, DDP's gradient-compression hook and where
the rendezvous listens. A request this machine cannot run raises ``RuntimeError`` here, before
anything starts. What-if presets (``CLUSTER_PRESETS``) resolve for hardware that is not here and
are labelled simulated.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from precision_nb.core import validate
from precision_nb.core.capabilities import Capabilities, get_capabilities
from precision_nb.core.cluster import (
    CLUSTER_PRESETS,
    ClusterPreset,
    cluster_capabilities,
    expected_comm_bytes,
    ring_seconds,
)
from precision_nb.core.distributed_reasons import (
    HOOK_REASONS,
    STRATEGY_REASONS,
    fsdp_dtypes,
    nodes_reason,
)
from precision_nb.core.plan import normalize_precision
from precision_nb.core.render import decision_lines
from precision_nb.core.resolution import Decision, Explanation, explain_precision

STRATEGIES: tuple[str, ...] = ("ddp", "fsdp2")
COMM_HOOKS: tuple[str, ...] = ("none", "fp16", "bf16")
BACKENDS: tuple[str, ...] = ("auto", "gloo", "nccl")
LOOPBACK = "127.0.0.1"
#: torchrun's default port for the c10d rendezvous (used when ``rdzv_port`` is not set).
TORCHRUN_PORT = 29400


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (127.0.0.0/8, ::1, localhost)."""
    return host in ("localhost", "::1") or host.startswith("127.")


@dataclass(frozen=True)
class Distributed:
    """A request to train on several processes, one device each, launched by ``torchrun``.

    ``strategy``: "ddp" (full replicas, gradients all-reduced) or "fsdp2" (``fully_shard``:
    parameters, gradients and optimizer state sharded). ``param_dtype`` / ``reduce_dtype`` /
    ``output_dtype`` (FSDP2 only; ``None`` derives them from the precision plan) and
    ``comm_hook`` (DDP only: "none", "fp16", "bf16" gradient compression). ``backend``: "auto"
    (gloo on CPU, nccl on CUDA), "gloo" or "nccl". ``rdzv_host``: where the rendezvous listens
    (loopback unless another address is asked for). ``count_collectives`` routes collectives
    through a counting layer that records bytes by op and dtype. ``timeout_s`` bounds the run.

    Several nodes: ``nnodes`` torchrun agents of ``nproc`` processes each (``nproc`` is per node;
    ``world_size`` = nnodes x nproc) join a c10d rendezvous at ``rdzv_host:rdzv_port``, waiting
    at most ``rdzv_timeout_s`` for every node. ``node_rank=None`` runs every node on this machine
    (each its own agent); ``node_rank=K`` makes this machine node K only, its agent joining the
    others at ``rdzv_host:rdzv_port`` (a port is then required: the other nodes must know it).
    """

    strategy: str = "ddp"
    nproc: int = 2
    param_dtype: Any = None
    reduce_dtype: Any = None
    output_dtype: Any = None
    comm_hook: str = "none"
    backend: str = "auto"
    rdzv_host: str = LOOPBACK
    count_collectives: bool = True
    timeout_s: float = 600.0
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_port: int | None = None
    rdzv_timeout_s: float = 300.0

    @property
    def world_size(self) -> int:
        """Processes in the whole run: nnodes x nproc."""
        return self.nnodes * self.nproc

    def nodes_here(self) -> tuple[int, ...]:
        """The node ranks whose torchrun agent runs on this machine."""
        return tuple(range(self.nnodes)) if self.node_rank is None else (self.node_rank,)

    def __post_init__(self) -> None:
        strategy = self.strategy.strip().lower() if isinstance(self.strategy, str) else None
        validate.choice("distributed.strategy", strategy or self.strategy, STRATEGIES)
        object.__setattr__(self, "strategy", strategy)
        validate.positive_int("distributed.nproc", self.nproc, maximum=4096)
        for name in ("param_dtype", "reduce_dtype", "output_dtype"):
            value = getattr(self, name)
            if value is not None:
                value = normalize_precision(value, f"distributed.{name}", allow_auto=False)
                object.__setattr__(self, name, value)
                if strategy != "fsdp2":
                    raise ValueError(
                        f"distributed.{name}: invalid value {value!r} with strategy "
                        f"{strategy!r}; allowed: None (FSDP2's MixedPrecisionPolicy applies to "
                        "strategy='fsdp2' only)"
                    )
        validate.choice("distributed.comm_hook", self.comm_hook, COMM_HOOKS)
        if self.comm_hook != "none" and strategy != "ddp":
            raise ValueError(
                f"distributed.comm_hook: invalid value {self.comm_hook!r} with strategy "
                f"{strategy!r}; allowed: 'none' (comm hooks are DDP's; FSDP2 sets reduce_dtype)"
            )
        validate.choice("distributed.backend", self.backend, BACKENDS)
        if not isinstance(self.rdzv_host, str) or not self.rdzv_host.strip():
            raise ValueError(
                f"distributed.rdzv_host: invalid value {validate.short_repr(self.rdzv_host)}; "
                "allowed: a host name or address (default 127.0.0.1)"
            )
        if not isinstance(self.count_collectives, bool):
            raise ValueError(
                f"distributed.count_collectives: invalid value "
                f"{validate.short_repr(self.count_collectives)}; "
                "allowed: true, false"
            )
        validate.number("distributed.timeout_s", self.timeout_s, minimum=0.0, strict=True)
        validate.positive_int("distributed.nnodes", self.nnodes, maximum=4096)
        rank = self.node_rank
        if rank is not None and not (
            isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < self.nnodes
        ):
            raise ValueError(
                f"distributed.node_rank: invalid value {validate.short_repr(rank)} with "
                f"nnodes={self.nnodes}; allowed: None (every node on this machine) or an "
                f"integer from 0 to {self.nnodes - 1} (this machine is that node)"
            )
        if self.rdzv_port is not None:
            validate.integer("distributed.rdzv_port", self.rdzv_port, 1, 65535)
        elif self.node_rank is not None and self.nnodes > 1:
            raise ValueError(
                f"distributed.rdzv_port: invalid value None with node_rank={self.node_rank}; "
                "allowed: the port (1-65535) where node 0's rendezvous listens, the same on "
                "every node (only a run with every node on this machine picks a free port)"
            )
        validate.number("distributed.rdzv_timeout_s", self.rdzv_timeout_s, minimum=0.0, strict=True)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DistributedPlan:
    """What a distributed run will do, with the decisions that produced it."""

    request: Distributed
    strategy: str
    nproc: int
    backend: str
    rank_device: str
    param_dtype: str | None
    reduce_dtype: str | None
    output_dtype: str | None
    comm_hook: str | None
    precision: Explanation
    decisions: tuple[Decision, ...]
    warnings: tuple[str, ...] = ()
    preset: ClusterPreset | None = None
    nnodes: int = 1

    @property
    def world_size(self) -> int:
        """Processes in the whole run: nnodes x nproc."""
        return self.nnodes * self.nproc

    @property
    def simulated(self) -> bool:
        return self.precision.simulated

    @property
    def device_type(self) -> str:
        return self.precision.plan.device_type

    def summary(self) -> str:
        what = (
            f"param {self.param_dtype}, reduce {self.reduce_dtype}"
            if self.strategy == "fsdp2"
            else f"comm hook {self.comm_hook}"
        )
        sim = " (simulated)" if self.simulated else ""
        procs = f"x{self.nproc}" if self.nnodes == 1 else f"{self.nnodes} nodes x{self.nproc}"
        return (
            f"{self.strategy} {procs} on {self.rank_device} over {self.backend}{sim}; "
            f"plan {self.precision.plan.mode}; {what}"
        )

    def __str__(self) -> str:
        lines = [f"Distributed plan: {self.summary()}"]
        if self.preset is not None:
            link = self.preset.link_gb_per_s
            bw = f"{link:g} GB/s per GPU per direction" if link else "no bandwidth figure"
            lines.append(
                f"What-if preset (simulated): {self.preset.name}: {self.preset.interconnect}, "
                f"{bw} ({self.preset.source})"
            )
        lines.extend(decision_lines(self.decisions, self.warnings))
        lines.append(str(self.precision))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.request.to_dict(),
            "strategy": self.strategy,
            "nproc": self.nproc,
            "nnodes": self.nnodes,
            "world_size": self.world_size,
            "backend": self.backend,
            "rank_device": self.rank_device,
            "param_dtype": self.param_dtype,
            "reduce_dtype": self.reduce_dtype,
            "output_dtype": self.output_dtype,
            "comm_hook": self.comm_hook,
            "simulated": self.simulated,
            "preset": asdict(self.preset) if self.preset is not None else None,
            "decisions": [asdict(d) for d in self.decisions],
            "warnings": list(self.warnings),
            "precision": self.precision.to_dict(),
        }


def _caps(hardware: Any) -> tuple[Capabilities, ClusterPreset | None]:
    if isinstance(hardware, str) and hardware in CLUSTER_PRESETS:
        cluster = CLUSTER_PRESETS[hardware]
        return cluster_capabilities(cluster), cluster
    try:
        return get_capabilities(hardware), None
    except ValueError:
        names = ", ".join(repr(n) for n in CLUSTER_PRESETS)
        raise ValueError(
            f"hardware: invalid value {validate.short_repr(hardware)}; allowed: None (this "
            f"machine), a cluster preset ({names}) or a capabilities preset"
        ) from None


def explain_distributed(
    distributed: Distributed | None = None,
    precision: Any = None,
    device: Any = "auto",
    hardware: Any = None,
    optimizer: Any = None,
) -> DistributedPlan:
    """Resolve a distributed request on this machine (``hardware=None``) or a simulated one.

    ``hardware``: None (this machine), a :data:`CLUSTER_PRESETS` name ("8xH100 NVLink") or a
    capabilities preset / :class:`Capabilities`.

    Raises ``RuntimeError`` when the machine (real or simulated) cannot run it: nccl without
    CUDA, more processes than CUDA devices, MPS (no torch.distributed backend).
    """
    req = distributed if distributed is not None else Distributed()
    if not isinstance(req, Distributed):
        raise ValueError(
            f"distributed: invalid value of type {type(req).__name__}; allowed: Distributed"
        )
    caps, cluster = _caps(hardware)
    expl = explain_precision(precision, device, caps, optimizer)
    plan = expl.plan
    kind = plan.device_type
    where = f" ({caps.name}, simulated)" if caps.simulated else ""
    if kind not in ("cpu", "cuda"):
        raise RuntimeError(
            f"device: {expl.device} has no torch.distributed backend (gloo runs on CPU, nccl on "
            "CUDA); use device='cpu' for a distributed run here"
        )
    decisions = [Decision("strategy", req.strategy, STRATEGY_REASONS[req.strategy])]
    warnings: list[str] = []
    # backend
    if req.backend == "auto" and kind == "cuda":
        backend, why = "nccl", "auto on CUDA: nccl, the GPU collective library"
    elif req.backend == "auto":
        backend, why = "gloo", "auto on CPU: gloo, torch's CPU collective backend (nccl needs CUDA)"
    else:
        backend, why = req.backend, f"backend={req.backend} as requested"
        if backend == "nccl" and kind != "cuda":
            raise RuntimeError(
                f"distributed.backend: 'nccl' requested but the device is {expl.device}{where}: "
                "nccl needs CUDA devices; use backend='auto' or 'gloo' on CPU"
            )
        if backend == "gloo" and kind == "cuda":
            warnings.append("gloo on CUDA stages tensors through the host: slower than nccl")
    decisions.append(Decision("backend", backend, why))
    # processes and their devices
    if kind == "cuda":
        count = caps.cuda_device_count
        if count is not None and req.nproc > count:
            raise RuntimeError(
                f"distributed.nproc: {req.nproc} processes requested but this machine{where} has "
                f"{count} CUDA device(s); one process per GPU allows nproc <= {count}"
            )
        rank_device = "cuda:LOCAL_RANK"
        why = f"one process per GPU ({count if count is not None else '?'} available)"
    else:
        rank_device = "cpu"
        cores = os.cpu_count() or 1
        here = req.nproc * len(req.nodes_here())
        why = f"{req.nproc} CPU processes on this machine's {cores} cores"
        if here != req.nproc:
            why = f"{req.nproc} CPU process(es) per node, {here} on this machine's {cores} cores"
        if here > cores and not caps.simulated:
            warnings.append(f"{here} processes share {cores} cores: step times measure contention")
    decisions.append(Decision("nproc", str(req.nproc), why))
    if req.nnodes > 1:
        decisions.append(Decision("nnodes", str(req.nnodes), nodes_reason(req)))
    rank_why = "each rank on its own GPU, cuda:LOCAL_RANK" if kind == "cuda" else "CPU ranks"
    decisions += [
        Decision("rank device", rank_device, rank_why),
        Decision(
            "batch",
            "global",
            f"each global batch is split into {req.world_size} equal slices, one per rank: the "
            "run trains what one process would; a batch not divisible by "
            f"{'nproc' if req.nnodes == 1 else 'nnodes x nproc'} is refused",
        ),
    ]
    param = reduce = output = hook = None
    if req.strategy == "fsdp2":
        fsdp, (param, reduce, output, extra) = fsdp_dtypes(req, plan.mode, plan.use_scaler)
        decisions += fsdp
        warnings += extra
    else:
        hook = req.comm_hook
        decisions.append(Decision("comm_hook", hook, HOOK_REASONS[hook]))
    decisions.append(_rendezvous(req))
    return DistributedPlan(
        request=req,
        strategy=req.strategy,
        nproc=req.nproc,
        backend=backend,
        rank_device=rank_device,
        param_dtype=param,
        reduce_dtype=reduce,
        output_dtype=output,
        comm_hook=hook,
        precision=expl,
        decisions=tuple(decisions),
        warnings=tuple(warnings) + expl.warnings,
        preset=cluster,
        nnodes=req.nnodes,
    )


def _rendezvous(req: Distributed) -> Decision:
    port = "<free port>" if req.rdzv_port is None else str(req.rdzv_port)
    where = f"[{req.rdzv_host}]" if ":" in req.rdzv_host else req.rdzv_host
    if is_loopback(req.rdzv_host):
        why = "loopback: nothing outside this machine can join"
    else:
        why = f"{req.rdzv_host} as requested (reachable by other machines on that network)"
    if req.rdzv_port is None:
        why += "; a free port is chosen at launch"
    if req.nnodes > 1:
        why += (
            f"; c10d rendezvous hosted by node 0, waiting up to {req.rdzv_timeout_s:g} s for "
            f"all {req.nnodes} nodes (rdzv_timeout_s)"
        )
    return Decision("rendezvous", f"{where}:{port}", why)


__all__ = [
    "BACKENDS",
    "TORCHRUN_PORT",
    "CLUSTER_PRESETS",
    "COMM_HOOKS",
    "STRATEGIES",
    "ClusterPreset",
    "Distributed",
    "DistributedPlan",
    "expected_comm_bytes",
    "explain_distributed",
    "is_loopback",
    "ring_seconds",
]
