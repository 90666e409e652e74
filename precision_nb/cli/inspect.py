"""``precision-nb inspect``: memory by kind and dtype and the op dtype trace of one training step.

Only argparse is imported at module level; torch, the engine, matplotlib and pandas load inside
:func:`run`. Writes ``inspection_memory.csv``, ``inspection_ops.csv`` (and
``inspection_policy.csv`` for a simulated device), PNG figures and ``inspection.html`` into
``--out``. Exit codes: 0 success, 2 bad input, 1 a failed inspection (e.g. out of memory).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

DEFAULT_OUT = "inspect-out"
DEFAULT_PRECISION = "fp32,bf16"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "inspect",
        help="memory by kind and dtype, and which ops ran in which dtype, for one training step",
        description=(
            "Run one instrumented training step (on a copy of the model) under each precision "
            "plan and write memory by kind and dtype, the op-by-op dtype trace, figures and an "
            "HTML section into --out. With --simulate, show autocast's policy for the "
            "simulated device type, read from the installed torch, instead of a trace."
        ),
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--workload", help="built-in workload: mlp, transformer (lm), cnn")
    source.add_argument(
        "--model", metavar="MODULE:FACTORY", help="a callable returning an nn.Module"
    )
    parser.add_argument("--preset", default=None, help="size preset of --workload")
    parser.add_argument(
        "--batches",
        metavar="MODULE:CALLABLE",
        help="with --model: a callable returning batches (an iterable or an index -> batch "
        "callable); required with --model",
    )
    parser.add_argument(
        "--precision",
        default=DEFAULT_PRECISION,
        metavar="MODES",
        help=f"comma-separated requests (auto, fp32, bf16, fp16); default {DEFAULT_PRECISION}",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps")
    parser.add_argument("--simulate", metavar="PRESET", help="capability preset, e.g. cuda-bf16")
    parser.add_argument("--loss-scale-lab", action="store_true", help="CPU fp16 + GradScaler")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder; default {DEFAULT_OUT}")
    parser.set_defaults(run=run)
    return parser


def _error(message: str) -> int:
    print(f"precision-nb inspect: error: {message}", file=sys.stderr)
    return 2


def load_object(spec: str, field: str) -> Any:
    """``"package.module:name"`` -> the object; ``ValueError`` naming the field otherwise."""
    from precision_nb.core.validate import short_repr

    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"{field}: invalid value {short_repr(spec)}; allowed: MODULE:NAME")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"{field}: cannot import module {short_repr(module_name)} ({exc})"
        ) from exc
    obj = getattr(module, name, None)
    if obj is None:
        raise ValueError(
            f"{field}: module {short_repr(module_name)} has no attribute {short_repr(name)}"
        )
    return obj


def check_flags(args: argparse.Namespace) -> None:
    """Check the flag values without importing torch (``ValueError`` naming the flag)."""
    from precision_nb.cli.profile import PRESET_NAMES, WORKLOAD_NAMES
    from precision_nb.core.names import device_string, precision_list
    from precision_nb.core.validate import choice

    if args.workload is not None:
        choice("--workload", str(args.workload).strip().lower(), WORKLOAD_NAMES)
    if args.preset is not None:
        choice("--preset", str(args.preset).strip().lower(), PRESET_NAMES)
    precision_list(args.precision, "--precision")
    device_string(args.device, "--device")


def _target(args: argparse.Namespace) -> tuple[Any, Any, str]:
    from precision_nb.engine.workloads import DEFAULT_PRESET, DEFAULT_WORKLOAD

    if args.model is not None:
        if args.batches is None:
            raise ValueError("--batches: required with --model (MODULE:CALLABLE)")
        factory = load_object(args.model, "--model")
        batches = load_object(args.batches, "--batches")
        return factory(), batches(), args.preset or "tiny"
    if args.batches is not None:
        raise ValueError("--batches: only with --model (workloads bring their own batches)")
    name = args.workload or DEFAULT_WORKLOAD
    preset = args.preset or (DEFAULT_PRESET if args.workload is None else "tiny")
    return name, None, preset


def run(args: argparse.Namespace) -> int:
    try:
        check_flags(args)
    except ValueError as err:
        return _error(str(err))
    from precision_nb.core.plan import PrecisionConfig
    from precision_nb.engine.results import FitError
    from precision_nb.views.report.inspection import inspect, write_inspection

    try:
        model, batches, preset = _target(args)
        modes = [m.strip() for m in str(args.precision).split(",") if m.strip()]
        requests = [PrecisionConfig(m, loss_scale_lab=args.loss_scale_lab) for m in modes]
        results = {}
        for request in requests:
            item = inspect(
                model,
                batches,
                request,
                device=args.device,
                preset=preset,
                capabilities=args.simulate,
            )
            label = item.label if item.label not in results else f"{item.label} ({request.mode})"
            if any(r.plan == item.plan for r in results.values()):
                print(f"{request.mode}: same plan as an earlier request, inspected once")
                continue
            results[label] = item
    except (ValueError, RuntimeError) as err:
        if isinstance(err, FitError):
            print(f"precision-nb inspect: failed: {err}", file=sys.stderr)
            return 1
        return _error(str(err))
    files = write_inspection(results, args.out)
    for label, item in results.items():
        print(repr(item))
        for flag in item.flags:
            print(f"  {label}: {flag.message}")
    print(f"wrote {len(files)} files into {args.out}/ (open inspection.html)")
    return 0
