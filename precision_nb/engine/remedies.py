"""A true plan's optimizer, built: torch's AdamW, or the remedy's library AdamW.

``bf16-true`` without a remedy trains with ``torch.optim.AdamW`` on the bf16 parameters
(:func:`~precision_nb.core.optim.build_optimizer`, with its fused decision). ``+stochastic`` builds
``torchao.optim._AdamW(params, bf16_stochastic_round=True)`` (torchao names its plain AdamW with a
leading underscore; the public ``torchao.optim.AdamW`` is the same class without that switch) and
``+kahan`` builds ``optimi.AdamW(params, lr=..., kahan_sum=True)``. Both take the plan's
``OptimizerConfig`` (lr, betas, eps, weight_decay; optimi's own defaults differ: beta2 0.99,
eps 1e-6). torchao runs its per-parameter update through ``torch.compile(fullgraph=True)``, which
on a CPU compiles C++ for every parameter shape (tens of seconds each on a small machine);
precision_nb runs the same function eagerly under ``torch.compiler.set_stance("force_eager")``
(:func:`eager_steps`), so no step pays a compile and no C++ compiler is needed. Importing
torchao on a machine without its CUDA extensions prints their load failures; :func:`quiet_import`
keeps that out of the user's output and logs it at debug level instead. Each optimizer carries
what ran and why as ``optimizer.precision_nb_fused`` (a
:class:`~precision_nb.core.optim.FusedOutcome` whose reason names the library call), as every
optimizer the trainer builds does.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import warnings
from typing import Any

import torch
from torch import nn

from precision_nb.core import remedies as described
from precision_nb.core.optim import FusedOutcome, OptimizerConfig, build_optimizer

log = logging.getLogger(__name__)


def quiet_import(module: str) -> Any:
    """Import ``module`` with its stdout, stderr and warnings captured (logged at debug level);
    log records below ERROR are muted while it imports, errors still reach the user."""
    out, err = io.StringIO(), io.StringIO()
    # torch's own loggers write to the stderr they were set up with: muted while importing
    logging.disable(logging.WARNING)
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            loaded = importlib.import_module(module)
    finally:
        logging.disable(logging.NOTSET)
    noise = out.getvalue() + err.getvalue() + "".join(f"{w.message}\n" for w in caught)
    if noise.strip():
        log.debug("import %s said:\n%s", module, noise)
    return loaded


def check_installed(plan: Any) -> None:
    """``ImportError`` naming the ``remedies`` extra when the plan's remedy is not installed."""
    remedy = getattr(plan, "remedy", "none")
    if remedy != "none" and not described.installed(remedy):
        raise ImportError(described.missing_message(remedy))


def eager_steps(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Make ``optimizer.step`` run its ``torch.compile`` calls eagerly (the same ops)."""
    compiled_step = optimizer.step

    def step(closure: Any = None) -> Any:
        with torch.compiler.set_stance("force_eager"):
            return compiled_step(closure)

    optimizer.step = step  # type: ignore[method-assign]
    return optimizer


def remedy_optimizer(params: list[nn.Parameter], cfg: OptimizerConfig, remedy: str) -> Any:
    """The remedy's library AdamW on ``params`` with ``cfg``'s settings."""
    kwargs = {"lr": cfg.lr, "betas": cfg.betas, "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    if remedy == "stochastic":
        optim = quiet_import("torchao.optim")
        return eager_steps(optim._AdamW(params, bf16_stochastic_round=True, **kwargs))
    if remedy == "kahan":
        return quiet_import("optimi").AdamW(params, kahan_sum=True, **kwargs)
    raise ValueError(f"precision.remedy: invalid value {remedy!r}; allowed: stochastic, kahan")


def build_plan_optimizer(
    model: nn.Module, cfg: OptimizerConfig, device: torch.device, plan: Any
) -> torch.optim.Optimizer:
    """The optimizer of ``plan``: :func:`build_optimizer` unless the plan has a remedy."""
    remedy = getattr(plan, "remedy", "none")
    if remedy == "none":
        return build_optimizer(model, cfg, device)
    check_installed(plan)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = remedy_optimizer(params, cfg, remedy)
    reason = (
        f"{plan.label}: {described.REMEDIES[remedy].call} runs on the {len(params)} {plan.dtype} "
        "parameter tensors; torch's fused AdamW does not apply"
        + ("; torchao's torch.compile of the update runs eagerly" if remedy == "stochastic" else "")
    )
    optimizer.precision_nb_fused = FusedOutcome(cfg.fused, None, False, reason, str(device))
    return optimizer
