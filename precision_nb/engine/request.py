"""One run as a public entry receives it: :class:`RunRequest`, checked once, and :func:`prepare`.

``fit``, ``compare``, ``profile``, ``fit_distributed`` and ``write_spec`` keep their keyword
signatures; each turns its arguments into one frozen :class:`RunRequest` (``RunRequest.of``) and
passes that on, so the arguments are checked in one place and never forwarded one by one; the
panel and the command line build one too. :meth:`RunRequest.check` adds the checks that need the
machine (the device, the compile modes, the first batch) before anything runs; a distributed
request's plans are resolved by :func:`~precision_nb.engine.distributed.measured.distributed_plans`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precision_nb.core import remedies, validate
from precision_nb.core.device import resolve_device
from precision_nb.core.distributed import Distributed
from precision_nb.core.names import COMPILE_MODES, compile_list, compile_name, precision_list
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.validate import short_repr
from precision_nb.engine.measure_config import MeasureConfig, check_rounds
from precision_nb.engine.run_setup import seed_everything
from precision_nb.engine.train_config import TrainConfig, make_train_config
from precision_nb.engine.workloads import Workload, get_workload

__all__ = ["ANALYSES", "RunRequest", "optimizer_config", "precision_config", "prepare"]

#: The analyses a comparison can be followed by (:mod:`precision_nb.engine.analyses`).
ANALYSES = ("inspect", "numerics", "time_split")

#: What a model argument may be: a module (with batches), a workload, or a workload's name.
ModelArg = nn.Module | Workload | str
#: A loss: a callable ``(output, target) -> scalar``, or its import path for torchrun workers.
LossArg = Callable[..., torch.Tensor] | str | None


def precision_config(
    value: PrecisionConfig | str | None, field_name: str = "precision", lab: bool = False
) -> Any:
    """A :class:`PrecisionConfig` from a config, a mode string or None (``auto``); ``lab`` turns a
    plain fp16 request into the CPU loss-scale lab's (the one place a request is coerced)."""
    if isinstance(value, PrecisionConfig):
        return value
    if value is not None and not isinstance(value, (str, torch.dtype)):
        allowed = "a PrecisionConfig, a mode name (auto, fp32, bf16, fp16) or None"
        raise _invalid(field_name, value, allowed)
    config = PrecisionConfig(mode=value if value is not None else "auto")
    if lab and config.requested == "fp16":
        return PrecisionConfig(mode=config.requested, loss_scale_lab=True)
    return config


def optimizer_config(value: OptimizerConfig | None) -> OptimizerConfig:
    """The optimizer settings (``OptimizerConfig()`` for None)."""
    if value is None:
        return OptimizerConfig()
    if not isinstance(value, OptimizerConfig):
        raise _invalid("optimizer", value, "an OptimizerConfig or None")
    return value


def _invalid(name: str, value: Any, allowed: str) -> ValueError:
    """The error for a ``value`` of the wrong kind given for ``name``."""
    kind = type(value).__name__
    return ValueError(f"{name}: invalid value {short_repr(value)} ({kind}); allowed: {allowed}")


@dataclass(frozen=True)
class RunRequest:
    """What one public call asked to run; every field checked on construction.

    ``precisions``: one request per plan (``fit`` takes exactly one: :attr:`precision`).
    ``loss_fn``: a callable, or ``"package.module:function"`` for a distributed run.
    ``compiles``: the compile modes ("off", "default", "reduce-overhead", "max-autotune"); a
    comparison measures every precision under every mode (``fit`` takes one: :attr:`compile`).
    ``measure``: how a comparison is measured (rounds, warm-up, processes, target, budget; more
    rounds than ``train.steps`` are refused). ``analyses``: what follows a comparison, of
    :data:`ANALYSES` ("inspect": each plan's inspection, "numerics": the numerics analysis,
    "time_split": a few profiled steps per plan after the timed rounds, the step time by op
    family: :mod:`precision_nb.engine.time_split`).
    ``distributed``: a :class:`~precision_nb.core.distributed.Distributed` request (torchrun's
    ranks; eager only) or None.
    """

    model: ModelArg
    batches: Any = None
    preset: str = "tiny"
    device: Any = "auto"
    precisions: tuple[PrecisionConfig, ...] = (PrecisionConfig(),)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    loss_fn: LossArg = None
    compiles: tuple[str, ...] = ("off",)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    analyses: tuple[str, ...] = ()
    distributed: Distributed | None = None

    def __post_init__(self) -> None:
        compiles = self.compiles
        if isinstance(compiles, (str, bool)) or compiles is None:
            compiles = (compiles,)  # type: ignore[assignment]
        names = tuple(compile_name(c) for c in compiles)
        if not names:
            raise ValueError("compile: no mode requested; allowed: one or more of " + ", ".join(
                COMPILE_MODES))  # fmt: skip
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(
                f"compile: invalid value {short_repr(compiles)}: {', '.join(repeated)} given "
                "twice; allowed: each mode once"
            )
        object.__setattr__(self, "compiles", names)
        precisions = self.precisions
        if isinstance(precisions, (PrecisionConfig, str)) or not isinstance(precisions, Sequence):
            precisions = (precisions,)  # type: ignore[assignment]
        object.__setattr__(self, "precisions", tuple(precision_config(p) for p in precisions))
        if not self.precisions:
            raise ValueError("precision: no precision requested; allowed: one or more modes")
        for p in self.precisions:  # a missing remedy library, before any plan runs
            if p.remedy != "none" and not remedies.installed(p.remedy):
                raise ImportError(remedies.missing_message(p.remedy))
        object.__setattr__(self, "optimizer", optimizer_config(self.optimizer))
        if not isinstance(self.train, TrainConfig):
            raise _invalid("train", self.train, "a TrainConfig or None")
        if not isinstance(self.preset, str):
            raise _invalid("preset", self.preset, "a preset name (tiny, small, medium, large)")
        loss_fn = self.loss_fn
        if loss_fn is not None and not callable(loss_fn) and not isinstance(loss_fn, str):
            raise _invalid(
                "loss_fn",
                loss_fn,
                "None, a callable (output, target) -> scalar loss tensor, or "
                "'package.module:function' for a distributed run",
            )
        if not isinstance(self.measure, MeasureConfig):
            raise ValueError(
                f"measure: invalid value {short_repr(self.measure)}; allowed: a MeasureConfig"
            )
        check_rounds(self.measure.rounds, self.train.steps)
        unknown = [a for a in self.analyses if a not in ANALYSES]
        if not isinstance(self.analyses, tuple) or unknown:
            raise ValueError(
                f"analyses: invalid value {short_repr(self.analyses)}; allowed: a tuple of "
                f"{', '.join(ANALYSES)}"
            )
        if self.distributed is not None and not isinstance(self.distributed, Distributed):
            raise ValueError(
                f"distributed: invalid value of type {type(self.distributed).__name__}; allowed: "
                "precision_nb.Distributed(strategy=..., nproc=...) or None"
            )
        if self.distributed is not None and self.compiles != ("off",):
            raise ValueError(
                f"compile: invalid value {','.join(self.compiles)!r} with a distributed run; "
                "allowed: 'off' (distributed runs train eagerly)"
            )

    @classmethod
    def of(
        cls,
        model: ModelArg,
        batches: Any = None,
        *,
        preset: str = "tiny",
        device: Any = "auto",
        precision: Any = None,
        optimizer: OptimizerConfig | None = None,
        train: TrainConfig | None = None,
        loss_fn: LossArg = None,
        compile: Any = "off",
        loss_scale_lab: bool = False,
        measure: MeasureConfig | None = None,
        analyses: Sequence[str] = (),
        distributed: Distributed | None = None,
        **train_options: Any,
    ) -> RunRequest:
        """The request of a public call: ``precision`` is one request (a ``PrecisionConfig``, a
        mode name or None), comma-separated names (``"fp32,bf16"``) or a sequence of them;
        ``compile`` one mode, comma-separated modes or a sequence; ``loss_scale_lab`` turns the
        plain fp16 requests into the CPU loss-scale lab's; ``train_options`` are ``TrainConfig``
        fields applied over ``train``."""
        validate.boolean("loss_scale_lab", loss_scale_lab)
        if isinstance(precision, str) and "," in precision:
            precision = precision_list(precision, "precision")
        many = isinstance(precision, Sequence) and not isinstance(precision, str)
        if isinstance(compile, str) and "," in compile:
            compile = compile_list(compile, "compile")
        modes = isinstance(compile, Sequence) and not isinstance(compile, str)
        given = precision if many else [precision]
        requests = [precision_config(p, lab=loss_scale_lab) for p in given]
        return cls(
            model=model,
            batches=batches,
            preset=preset,
            device=device,
            precisions=tuple(requests),
            optimizer=optimizer_config(optimizer),
            train=make_train_config(train, train_options),
            loss_fn=loss_fn,
            compiles=tuple(compile) if modes else (compile,),
            measure=MeasureConfig() if measure is None else measure,
            analyses=tuple(analyses),
            distributed=distributed,
        )

    @property
    def compile(self) -> str:
        """The one compile mode of a single run."""
        if len(self.compiles) != 1:
            raise ValueError(
                f"compile: {len(self.compiles)} modes given ({', '.join(self.compiles)}); a "
                "single run takes one"
            )
        return self.compiles[0]

    @property
    def precision(self) -> PrecisionConfig:
        """The one precision request of a single run."""
        if len(self.precisions) != 1:
            raise ValueError(
                f"precision: {len(self.precisions)} requests given; a single run takes one"
            )
        return self.precisions[0]

    def replace(self, **changes: Any) -> RunRequest:
        """A copy with ``changes`` applied (and checked again)."""
        return dataclasses.replace(self, **changes)

    def prepare(self) -> tuple[nn.Module, Any, dict[str, Any]]:
        """Model, batches and workload info, built as :func:`prepare` builds them."""
        return prepare(self.model, self.batches, self.preset, self.device, self.train.seed)

    def check(self) -> RunRequest:
        """The checks that need the machine, before anything runs (returns ``self``).

        ``ValueError`` for an unknown workload or preset, batches of your own model that cannot
        be replayed or whose first batch is not a tensor, tuple or mapping; ``RuntimeError`` for
        a device or a compile mode this machine cannot run (naming what is missing).
        """
        from precision_nb.core.compile_mode import resolve_compile
        from precision_nb.engine.batches import BatchSource

        where = resolve_device(self.device)  # RuntimeError for absent CUDA/MPS
        if isinstance(self.model, nn.Module):
            if self.batches is None:
                raise ValueError(
                    f"batches: invalid value None for model {type(self.model).__name__}; allowed: "
                    "a list of batches, a DataLoader or a callable taking the microbatch index"
                )
            source = BatchSource(self.batches)  # ValueError for the wrong kind of source
            if source.one_shot:
                raise ValueError(
                    f"batches has type {type(self.batches).__name__}, a one-shot iterator; "
                    "a comparison replays the batches for every plan: pass a list, a DataLoader "
                    "or a callable"
                )
            source.get(0)  # ValueError when the first batch is not a tensor, tuple or mapping
        elif isinstance(self.model, str):
            get_workload(self.model, self.preset)
        elif not isinstance(self.model, Workload):
            raise ValueError(
                f"model: invalid value of type {type(self.model).__name__}; allowed: a "
                "torch.nn.Module or a built-in workload name (mlp, transformer, cnn)"
            )
        for mode in self.compiles:  # refused now (no C++ compiler, no Triton), not after a warm-up
            if mode != "off":
                resolve_compile(mode, where.type)
        return self


def prepare(
    model: ModelArg | None,
    batches: Any,
    preset: str,
    device: Any,
    seed: int | None,
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """Model, batches and workload info from a module (+ batches) or a workload / its name.

    A workload's model is built right after ``seed_everything(seed)`` and its batches are
    placed on the device the trainer will resolve.
    """
    if resolve_device(device).type == "meta":  # torch would fail deep inside the first step
        raise ValueError(
            "device: 'meta' holds shapes without data, so nothing can train or be measured on "
            "it; allowed: 'auto', 'cpu', 'cuda', 'cuda:N', 'mps' or another device with data"
        )
    info: dict[str, Any] = {}
    if isinstance(model, str):
        model = get_workload(model, preset)
    if isinstance(model, Workload):
        seed_everything(seed or 0)
        info = dict(model.info)
        if batches is None:
            batches = model.make_batches(resolve_device(device))
        model = model.make_model()
    if batches is None:
        raise ValueError("batches is None; pass batches for your own model (or a workload name)")
    return model, batches, info
