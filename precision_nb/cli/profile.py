"""``precision-nb profile``: run a comparison of precision plans and write a report folder.

Only argparse is imported at module level; the engine, matplotlib and pandas load inside
:func:`run`, so ``precision-nb plan`` and ``--help`` stay fast.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from precision_nb.cli.main import FUSED, fused_arg

DEFAULT_COMPARE = "fp32,bf16,fp16"
DEFAULT_OUT = "profile-out"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "profile",
        help="measure a model under several precision plans and write a report",
        description=(
            "Train a built-in workload (or your own model, --model) under each requested "
            "precision plan from the same initial weights: a warm-up per plan, then the plans "
            "interleaved in rounds. Writes metrics.csv, summary.csv (speedups with 95 %% "
            "intervals), PNG figures and a self-contained report.html into --out. Requests that "
            "resolve to the same plan run once."
        ),
    )
    parser.add_argument(
        "--model",
        default=None,
        metavar="MODULE:FACTORY",
        help="profile your own model: package.module:factory, a callable returning an "
        "nn.Module (the current folder is importable); replaces --workload",
    )
    parser.add_argument(
        "--batches",
        default=None,
        metavar="MODULE:NAME",
        help="batches for --model: a list, a DataLoader, a callable of the microbatch index, or "
        "a callable without arguments returning one of those; default: the name `batches` in "
        "the factory's module",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved rounds the measured steps are split over; default 8",
    )
    parser.add_argument(
        "--workload",
        default=None,
        help="built-in workload: mlp, transformer (lm), cnn; "
        "default: the built-in default workload",
    )
    parser.add_argument(
        "--preset",
        default=None,
        help="size preset: tiny, small, medium, large; default: the default workload's preset",
    )
    parser.add_argument(
        "--compare",
        default=DEFAULT_COMPARE,
        metavar="MODES",
        help="comma-separated precision requests (auto, fp32, bf16, fp16); "
        f"default {DEFAULT_COMPARE}",
    )
    parser.add_argument(
        "--device", default="auto", help="auto, cpu, cuda, cuda:N, mps; default auto"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="measured optimizer steps per plan; default 48"
    )
    parser.add_argument(
        "--accumulation", type=int, default=1, help="microbatches per optimizer step; default 1"
    )
    parser.add_argument(
        "--fused",
        type=fused_arg,
        default="auto",
        help="fused AdamW: auto (probe), true (attempt), false (disable); default auto",
    )
    parser.add_argument(
        "--loss-scale-lab",
        action="store_true",
        help="allow fp16 with a CPU GradScaler to watch loss scaling without a GPU",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help=f"output folder; default ./{DEFAULT_OUT}"
    )
    parser.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    # Accepted only to be refused with a reason (argparse would just say "unrecognized").
    parser.add_argument("--simulate", nargs="?", const="", default=None, help=argparse.SUPPRESS)
    parser.set_defaults(run=run)
    return parser


def _error(message: str) -> int:
    print(f"precision-nb profile: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.simulate is not None:
        return _error(
            "--simulate is not available for profile: nothing can train on simulated hardware. "
            "Use `precision-nb plan --simulate PRESET` to see the plan a machine would get."
        )
    from precision_nb.views.report.profile import run_profile, validate_request

    try:
        model, batches = _user_model(args)
        request = validate_request(
            workload=args.workload if model is None else model,
            batches=batches,
            rounds=args.rounds,
            preset=args.preset,
            modes=args.compare,
            device=args.device,
            steps=args.steps,
            accumulation=args.accumulation,
            fused=FUSED[args.fused],
            loss_scale_lab=args.loss_scale_lab,
            out=args.out,
        )
    except (ValueError, RuntimeError) as err:
        return _error(str(err))

    command = "precision-nb " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else ""
    try:
        output = run_profile(
            request, progress=not args.no_progress, settings={"command": command.strip()}
        )
    except ValueError as err:  # the output folder turned out not to be writable
        return _error(str(err))
    except RuntimeError as err:  # a run failed (FitError and friends carry the reason)
        print(f"precision-nb profile: run failed: {err}", file=sys.stderr)
        return 1
    _print_outcome(output)
    failures = getattr(output.comparison, "failures", None) or {}
    for label, why in failures.items():
        print(
            f"precision-nb profile: plan {label} {why}; the report covers what it completed",
            file=sys.stderr,
        )
    return 1 if failures else 0


def _load(flag: str, spec: str) -> tuple[Any, Any]:
    """``package.module:name`` -> (module, object); ``ValueError`` naming the flag otherwise."""
    import importlib
    import os

    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"{flag}: invalid value {spec!r}; allowed: package.module:name")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the current folder is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{flag}: cannot import module {module_name!r}: {err}") from err
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{flag}: module {module_name!r} has no attribute {name!r}")
        obj = getattr(obj, part)
    return module, obj


def _user_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """(model, batches) for ``--model`` / ``--batches``; (None, None) for a built-in workload."""
    import inspect

    from torch import nn

    if args.model is None:
        if args.batches is not None:
            raise ValueError("--batches: given without --model; built-in workloads bring theirs")
        return None, None
    if args.workload is not None:
        raise ValueError("--model and --workload: give one of them")
    module, factory = _load("--model", args.model)
    if not callable(factory):
        raise ValueError(
            f"--model: {args.model} is a {type(factory).__name__}; allowed: a callable returning "
            "an nn.Module"
        )
    try:
        model = factory()
    except Exception as err:
        raise ValueError(f"--model: {args.model}() raised {type(err).__name__}: {err}") from err
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"--model: {args.model}() returned {type(model).__name__}; allowed: a torch.nn.Module"
        )
    if args.batches is not None:
        _, batches = _load("--batches", args.batches)
    elif hasattr(module, "batches"):
        batches = module.batches
    else:
        raise ValueError(
            f"--batches: not given, and module {module.__name__!r} has no name `batches`; "
            "pass --batches package.module:name"
        )
    if callable(batches) and not hasattr(batches, "__iter__"):
        required = [
            p
            for p in inspect.signature(batches).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if not required:  # a factory of the batch source
            batches = batches()
    return model, batches


def _print_outcome(output: Any) -> None:
    table = output.summary
    columns = [
        c
        for c in (
            "run",
            "final_loss",
            "median_step_time_s",
            "step_time_iqr_s",
            "speedup_vs_fp32",
            "speedup_ci_low",
            "speedup_ci_high",
            "warmup_steps",
            "peak_memory_mib",
            "skipped_steps",
            "fused_adamw",
            "also_requested_as",
        )
        if c in table
    ]
    print(table[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for verdict in getattr(output, "verdicts", {}).values():
        print(f"verdict: {verdict}")
    for hint in output.hints:
        print(f"hint: {hint}")
    print(f"wrote {len(output.files)} files into {output.out_dir}/ (open report.html)")
    if getattr(output.comparison, "stopped", False):
        print(
            "precision-nb profile: stopped early; the report covers the steps made before the stop",
            file=sys.stderr,
        )
