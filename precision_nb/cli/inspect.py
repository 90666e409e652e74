"""``precision-nb inspect``: memory by kind and dtype and the op dtype trace of one training step.

Only argparse is imported at module level; torch, the engine, matplotlib and pandas load inside
:func:`run`. Writes ``inspection_memory.csv``, ``inspection_ops.csv`` (and
``inspection_policy.csv`` for a simulated device), PNG figures and ``inspection.html`` into
``--out``, atomically (staged, moved in when complete). Exit codes: 0 success, 2 bad input
(``--out`` an existing file included), 1 a failed inspection (e.g. out of memory) or write (e.g.
a full disk; ``--out`` is then left as it was), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from precision_nb.cli.main import (
    EXIT_FAILED,
    HelpFormatter,
    cli_text,
    error,
    paragraphs,
    run_failed,
)
from precision_nb.cli.user_model import add_source_flags, check_source, target

DEFAULT_OUT = "inspect-out"
DEFAULT_PRECISION = "fp32,bf16"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "inspect",
        help="memory by kind and dtype, and which ops ran in which dtype, for one training step",
        formatter_class=HelpFormatter,
        description=paragraphs(
            "Run one instrumented training step (on a copy of the model) under each precision "
            "plan and write memory by kind and dtype, the op-by-op dtype trace, figures and an "
            "HTML section into --out. With --simulate, show autocast's policy for the "
            "simulated device type, read from the installed torch, instead of a trace.",
            "--model and --batches load your own model as for `precision-nb profile`.",
        ),
    )
    add_source_flags(
        parser,
        "batches for --model: a list, a DataLoader, a callable of the microbatch index, or "
        "a callable without arguments returning one of those (the first batch is used); "
        "default: the name `batches` in the factory's module",
    )
    parser.add_argument(
        "--precision",
        default=DEFAULT_PRECISION,
        metavar="MODES",
        help="comma-separated precision requests (auto, fp32, bf16, fp16, and true plans: "
        "bf16-true, fp16-true, with +stochastic or +kahan)",
    )
    parser.add_argument(
        "--device", default="auto", help="auto, cpu, cuda, cuda:N, mps or another torch device"
    )
    parser.add_argument(
        "--simulate",
        metavar="PRESET",
        help="simulated hardware (a `precision-nb plan --simulate` preset): autocast's policy "
        "for its device type, read from the installed torch, instead of a trace; default: this "
        "machine",
    )
    parser.add_argument(
        "--loss-scale-lab", action="store_true", help="fp16 with a CPU GradScaler on a CPU"
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder")
    parser.set_defaults(run=run)
    return parser


def check_flags(args: argparse.Namespace) -> None:
    """Check the flag values and ``--out`` without importing torch (``ValueError`` naming the
    flag)."""
    from precision_nb.core.names import device_string, precision_list
    from precision_nb.core.remedies import check_flag
    from precision_nb.views.report.folder import check_output_folder

    check_source(args)
    check_flag(precision_list(args.precision, "--precision"), "--precision")
    device_string(args.device, "--device")
    check_output_folder(Path(args.out).expanduser(), "--out")


def run(args: argparse.Namespace) -> int:
    try:
        check_flags(args)
    except ValueError as err:
        return error("inspect", err)
    from precision_nb.core.device import resolve_device
    from precision_nb.core.plan import PrecisionConfig
    from precision_nb.views.report.folder import ReportWriteError
    from precision_nb.views.report.inspection import inspect, write_inspection

    try:
        model, batches, preset = target(args)
        resolve_device(args.device, args.simulate)  # absent hardware: exit 2 before any step
        modes = [m.strip() for m in str(args.precision).split(",") if m.strip()]
        requests = [PrecisionConfig(m, loss_scale_lab=args.loss_scale_lab) for m in modes]
    except (ValueError, RuntimeError) as err:
        return error("inspect", err)
    options = {"device": args.device, "preset": preset, "capabilities": args.simulate}
    results = {}
    try:
        for request in requests:
            item = inspect(model, batches, request, **options)
            label = item.label if item.label not in results else f"{item.label} ({request.mode})"
            if any(r.plan == item.plan for r in results.values()):
                print(f"{request.mode}: same plan as an earlier request, inspected once")
                continue
            results[label] = item
    except ValueError as err:
        return error("inspect", err)
    except RuntimeError as err:  # the step failed: the model's own error, out of memory, ...
        print(f"precision-nb inspect: failed: {cli_text(str(err))}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as err:  # noqa: BLE001 - your model's own error: its type, message, line
        return run_failed("inspect", err)
    try:  # staged and moved in when complete: a failed write leaves --out as it was
        files = write_inspection(results, Path(args.out).expanduser())
    except ReportWriteError as err:
        return error("inspect", err.strerror, EXIT_FAILED)
    for label, item in results.items():
        print(repr(item))
        for flag in item.flags:
            print(f"  {label}: {flag.message}")
    print(f"wrote {len(files)} files into {args.out}/ (open inspection.html)")
    return 0
