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
        help="train a built-in workload under several precision plans and write a report",
        description=(
            "Train a built-in workload for a few steps under each requested precision plan (same "
            "seed) and write metrics.csv, summary.csv, PNG figures and a self-contained "
            "report.html into --out. Requests that resolve to the same plan run once."
        ),
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
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per plan")
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
        request = validate_request(
            workload=args.workload,
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
    return 0


def _print_outcome(output: Any) -> None:
    table = output.summary
    columns = [
        c
        for c in (
            "run",
            "final_loss",
            "median_step_time_s",
            "speedup_vs_fp32",
            "peak_memory_mib",
            "skipped_steps",
            "fused_adamw",
            "also_requested_as",
        )
        if c in table
    ]
    print(table[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for hint in output.hints:
        print(f"hint: {hint}")
    print(f"wrote {len(output.files)} files into {output.out_dir}/ (open report.html)")
    if getattr(output.comparison, "stopped", False):
        print(
            "precision-nb profile: stopped early; the report covers the steps made before the stop",
            file=sys.stderr,
        )
