"""True plans' optimizers described without importing them: which library runs, and why.

A ``true`` plan (``bf16-true``) keeps the weights in bf16, where an update smaller than half a unit
in the last place of a weight is rounded away. Its remedies are library optimizers, not code of ours
(:data:`REMEDIES` says how each works): ``stochastic`` is torchao's AdamW with
``bf16_stochastic_round=True`` and ``kahan`` is torch-optimi's AdamW with ``kahan_sum=True``. Both
are optional: the ``remedies`` extra installs them, and a missing one is named with that extra.
Availability is read with ``importlib.util.find_spec``, so describing a plan imports neither library
(torchao prints load failures of its CUDA extensions on a CPU-only machine).
:mod:`precision_nb.engine.remedies` builds the optimizers.

Decided here, for every true plan:

- a remedy with ``optimizer.fused=true`` is refused: the remedy's library optimizer is what runs,
  and a request for torch's fused kernel would be silently dropped otherwise; ``fused=None`` (the
  default) gives the remedy's optimizer, and the explanation says that no fused probe applies;
- ``fp16-true`` with ``optimizer.fused=false`` is refused: torch's plain AdamW would run on fp16
  state and write NaN or inf where ``(1-beta2)*grad**2`` underflows (tested against the installed
  torch). ``fp16-true+kahan`` needs ``optimizer.eps`` of at least fp16's smallest subnormal
  (2**-24): torch-optimi adds eps to fp16 state, where the default 1e-8 rounds to 0 and an element
  whose gradients have all been 0 gets 0/0 = NaN (tested against the installed library).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

#: The optional dependency group that installs the remedies' libraries.
EXTRA = "remedies"
INSTALL = f"pip install 'precision-nb[{EXTRA}]'"


@dataclass(frozen=True)
class Remedy:
    """One remedy: the library (its pip and import names) and the optimizer call it makes."""

    package: str
    module: str
    call: str
    how: str


REMEDIES: dict[str, Remedy] = {
    "stochastic": Remedy(
        "torchao",
        "torchao",
        "torchao.optim._AdamW(params, bf16_stochastic_round=True)",
        "stochastic rounding: each bf16 weight update is rounded up or down at random with "
        "probabilities that make the rounded value right on average, so an update below half "
        "a unit in the last place moves the weight now and then instead of never",
    ),
    "kahan": Remedy(
        "torch-optimi",
        "optimi",
        "optimi.AdamW(params, lr=..., kahan_sum=True)",
        "Kahan summation: a compensation buffer per parameter (in the parameter's dtype, one "
        "more tensor the size of the weights) keeps the part of each update that rounding "
        "dropped and adds it back at the next step",
    ),
}


def installed(remedy: str) -> bool:
    """Whether the library of ``remedy`` can be imported (looked up, not imported)."""
    return importlib.util.find_spec(REMEDIES[remedy].module) is not None


def missing_message(remedy: str) -> str:
    """The error text for a remedy whose library is not installed, naming the extra."""
    spec = REMEDIES[remedy]
    return (
        f"precision.remedy: {remedy!r} needs {spec.package} ({spec.call}), which is not "
        f"installed; {INSTALL} (or pip install {spec.package}) installs it"
    )


def check_flag(labels: list[str], flag: str) -> None:
    """A command line's precision flag (canonical spellings): ``ValueError`` naming the flag
    and the extra when a remedy it names is not installed (checked before anything runs)."""
    for label in labels:
        remedy = label.partition("+")[2]
        if remedy in REMEDIES and not installed(remedy):
            raise ValueError(f"{flag}: invalid value {label!r}: " + missing_message(remedy))


#: fp16's smallest subnormal: an AdamW eps below it rounds to 0 in fp16 state.
FP16_TINIEST = 2.0**-24


def optimizer_decision(plan: Any, optimizer: Any) -> tuple[str, str] | None:
    """The optimizer of a true plan as (outcome, reason) for its "remedy" decision; None for a
    plan that is not true. ``optimizer``: the ``OptimizerConfig``. ``ValueError`` for a
    combination refused (module docstring)."""
    if not getattr(plan, "true_weights", False):
        return None
    fused = optimizer.fused
    dtype = str(plan.dtype).removeprefix("torch.")
    if plan.remedy == "none":
        if plan.mode == "fp16" and fused is False:
            raise ValueError(
                "optimizer.fused: invalid value False for fp16-true: torch's plain AdamW keeps "
                "exp_avg_sq in fp16, where (1-beta2)*grad**2 underflows to 0 and eps=1e-8 "
                "rounds to 0, so it writes NaN or inf into the weights; allowed: fused None or "
                "True (the fused kernel computes in fp32), or bf16-true"
            )
        return (
            f"torch AdamW on {dtype} weights, no remedy",
            f"round-to-nearest: an update smaller than half a unit in the last place of a "
            f"{dtype} weight is rounded away (measured on the run: records' "
            "updates_rounded_away); remedies: +stochastic, +kahan",
        )
    spec = REMEDIES[plan.remedy]
    if plan.mode == "fp16" and optimizer.eps < FP16_TINIEST:
        raise ValueError(
            f"optimizer.eps: invalid value {optimizer.eps!r} for {plan.label}: {spec.package} adds "
            "eps to fp16 state, where it rounds to 0, so an element whose gradients have all been "
            f"0 gets 0/0 = NaN; allowed: eps >= 2**-24 ({FP16_TINIEST:.3g}), e.g. 1e-7"
        )
    if fused is True:
        raise ValueError(
            f"optimizer.fused: invalid value True with remedy {plan.remedy!r}: the remedy runs "
            f"{spec.call}, not torch's fused AdamW, so the fused request could not be honoured; "
            "allowed: fused None or False with a remedy, or no remedy with fused True"
        )
    state = "installed" if installed(plan.remedy) else f"NOT installed: {INSTALL}"
    return (
        spec.call,
        f"{spec.how}; {spec.package} is {state}. torch's fused AdamW does not apply (the "
        "remedy's optimizer runs instead)",
    )
