"""What the op trace and the memory inspection can and cannot see of a compiled plan.

The op trace records ATen ops with a ``TorchDispatchMode``. torch.compile does not run under one:
while a (non-infrastructure) dispatch mode is active, dynamo skips the frame ("non-infra torch
dispatch mode present, this is not supported today in torch.compile") and the model runs eagerly.
A trace of a compiled plan would therefore show eager ops as if they had run. The inspection of a
compiled plan traces the eager step of the same precision instead and says so (a test pins this
torch behaviour). Inside the compiled graph, inductor's fused kernels are generated code, not ATen
ops: no dispatch mode sees them, nor the casts and intermediates they fuse away.

The memory inspection reads tensors themselves: which of its rows hold for the compiled plan,
and which describe the eager step, is the "memory" caveat of :func:`inspection_caveats`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from precision_nb.core.compile_mode import CompilePlan

__all__ = ["DISPATCH_MODE_SKIP", "Caveat", "inspection_caveats", "mark_compiled"]

#: torch's own words for skipping a compiled frame while a dispatch mode is active.
DISPATCH_MODE_SKIP = "non-infra torch dispatch mode present, this is not supported today"


@dataclass(frozen=True)
class Caveat:
    """What one part of the inspection shows of a compiled plan: ``part`` ("ops", "memory"),
    ``sees`` (what holds for the compiled plan) and ``cannot`` (what it cannot see)."""

    part: str
    sees: str
    cannot: str

    def text(self) -> str:
        return f"{self.part}: {self.sees}; {self.cannot}"


def inspection_caveats(plan: CompilePlan, precision: str) -> tuple[Caveat, ...]:
    """The caveats an inspection of a plan compiled as ``plan`` carries (none for eager)."""
    if not plan.enabled:
        return ()
    # what inductor writes for the plan's device ("C++", "Triton", "Metal"), or "generated"
    language = plan.codegen.split(" ", 1)[0] if plan.codegen else "generated"
    return (
        Caveat(
            "ops",
            f"the op trace is of the EAGER {precision} step: torch.compile does not run while "
            f"the tracer's dispatch mode is active (torch: '{DISPATCH_MODE_SKIP}'), so the "
            "trace records the ops eager runs, labelled as such",
            f"inside the compiled graph inductor's fused {language} kernels "
            "are not ATen ops: which casts and intermediates they fuse away is not visible to "
            "any dispatch mode",
        ),
        Caveat(
            "memory",
            "parameters, gradients and optimizer state are the same tensors compiled or eager, "
            "so their rows hold for the compiled plan; step-time peaks are measured on the "
            "compiled plan itself",
            "saved activations and autocast weight copies describe the eager step: the compiled "
            "graph saves what AOTAutograd's partitioner chooses (it may recompute instead) and "
            "inductor may fuse casts into the kernels that use them",
        ),
    )


def mark_compiled(data: Any, plan: CompilePlan, label: str) -> Any:
    """An inspection (``InspectionData``) of a compiled plan, labelled ``label`` and with the
    caveats first among its flags (the views show the first flag in bold). Returns ``data``."""
    from precision_nb.engine.inspect.op_trace import Flag

    caveats = inspection_caveats(plan, data.plan.mode)
    data.label = label
    data.flags[:0] = [Flag("compiled", c.text(), {"part": c.part}) for c in caveats]
    return data
