"""``precision-nb plan``: print the resolved plan and the decisions behind it, or the plan as code.

Module-level imports stay light (argparse only). Flag values and the ``--config`` file are checked
before torch loads; the core loads when the command runs. Flags override the values of
``--config``. Bad input prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from precision_nb.cli.main import (
    EXIT_FAILED,
    EXIT_OK,
    FUSED,
    HelpFormatter,
    cli_text,
    error,
    fused_arg,
    paragraphs,
)

#: ``--simulate`` presets (core.capabilities.PRESETS, listed here so checking needs no torch).
SIMULATE_PRESETS = (
    "this-machine",
    "cpu-only",
    "cuda-bf16",
    "cuda-fp8",
    "cuda-bf16-emulated",
    "cuda-no-bf16",
    "cuda-bf16-error",
    "mps",
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan",
        help="resolve device and precision and explain every decision",
        formatter_class=HelpFormatter,
        description=paragraphs(
            "Resolve a device and precision request to the plan the trainer would use, with the "
            "ordered decisions, the resolution rule that applied and warnings. Flags override "
            "--config.",
            "The resolution rules: docs/plans.md#resolution-rules.",
        ),
    )
    parser.add_argument(
        "--device",
        help="auto, cpu, cuda, cuda:N, mps or another torch device string "
        "(default: the --config value, else auto)",
    )
    parser.add_argument(
        "--mode",
        help="auto, fp32, bf16, fp16, or a true plan: bf16-true, fp16-true, with +stochastic or "
        "+kahan (default: the --config value, else auto)",
    )
    parser.add_argument(
        "--dtype",
        help="fp32, bf16 or fp16; counts only when the mode is auto (default: the --config "
        "value, else none)",
    )
    parser.add_argument(
        "--fused",
        type=fused_arg,
        help="fused AdamW: auto (probe), true (attempt), false (disable) (default: the --config "
        "value, else auto)",
    )
    parser.add_argument(
        "--compile",
        metavar="MODE",
        default="off",
        help="torch.compile as part of the plan: off, default, reduce-overhead, max-autotune; "
        "resolved with what this torch supports on the device (default: %(default)s)",
    )
    parser.add_argument(
        "--simulate",
        metavar="PRESET",
        help=f"explain for simulated hardware: {', '.join(SIMULATE_PRESETS)} "
        "(default: this machine, read from torch)",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="YAML file: device, precision, optimizer (default: none)"
    )
    parser.add_argument(
        "--as",
        dest="as_framework",
        metavar="FRAMEWORK",
        type=framework_arg,
        help="print the plan as a runnable script instead: pytorch (a plain loop), lightning, "
        "accelerate or transformers; what does not carry over is said in comments "
        "(default: the explanation)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="run one matmul under the plan's autocast on the device and report the dtype used",
    )
    parser.add_argument(
        "--loss-scale-lab",
        action="store_true",
        default=None,
        help="opt in to CPU fp16 with a CPU GradScaler, outside the resolution rules "
        "(default: the --config value, else off)",
    )
    parser.set_defaults(run=run)
    return parser


def framework_arg(value: str) -> str:
    """argparse type of ``--as``: a key of ``core.plan_code.FRAMEWORKS`` (any case)."""
    from precision_nb.core.plan_code import framework_name

    try:
        return framework_name(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("framework: ")) from None


def check_flags(args: argparse.Namespace) -> Any:
    """Check every flag value and read ``--config`` without importing torch.

    Returns the config file's plain data (or None); ``ValueError``/``OSError`` otherwise.
    """
    from precision_nb.core.names import compile_name, device_string, plan_request, precision_name
    from precision_nb.core.validate import choice
    from precision_nb.core.yaml_source import read_source

    if args.device is not None:
        device_string(args.device, "--device")
    if args.mode is not None:
        plan_request(args.mode, "--mode")
    if args.dtype is not None:
        precision_name(args.dtype, "--dtype", allow_auto=False)
    if args.simulate is not None:
        choice("--simulate", args.simulate, SIMULATE_PRESETS)
    args.compile = compile_name(args.compile, "--compile")
    return read_source(args.config) if args.config else None


def _explain(args: argparse.Namespace, config_data: Any) -> Any:
    from dataclasses import replace

    from precision_nb.core.capabilities import get_capabilities
    from precision_nb.core.config import RunConfig, load_config
    from precision_nb.core.plan import PrecisionConfig
    from precision_nb.core.resolution import explain_precision

    cfg = load_config(config_data) if config_data is not None else RunConfig()
    precision = cfg.precision
    flags = ("mode", "dtype", "loss_scale_lab")
    overrides = {k: getattr(args, k) for k in flags if getattr(args, k) is not None}
    if overrides:
        precision = PrecisionConfig(**{**precision.to_dict(), **overrides})
    optimizer = cfg.optimizer
    if args.fused is not None:
        optimizer = replace(optimizer, fused=FUSED[args.fused])
    device = args.device if args.device is not None else cfg.device
    caps = get_capabilities(args.simulate)
    return explain_precision(precision, device, caps, optimizer=optimizer, compile=args.compile)


def _verify(explanation: Any) -> Any:
    from precision_nb.core.amp import verify_autocast

    if explanation.simulated:
        raise ValueError(
            f"--verify: runs on real hardware only, not with --simulate "
            f"{explanation.capabilities.name!r}"
        )
    return verify_autocast(explanation.plan, explanation.device)


def run(args: argparse.Namespace) -> int:
    try:
        config_data = check_flags(args)
        explanation = _explain(args, config_data)
        check = _verify(explanation) if args.verify else None
    except (ValueError, RuntimeError, OSError) as exc:
        return error("plan", exc)
    code = explanation.code(args.as_framework) if args.as_framework else None
    if args.json:
        data = explanation.to_dict()
        if check is not None:
            data["autocast_check"] = check.to_dict()
        if code is not None:
            data["code"] = {"framework": args.as_framework, "text": code}
        print(json.dumps(data, indent=2))
    elif code is not None:  # the script; a check below it is a comment
        print(code, end="")
        if check is not None:
            print(f"# Autocast check: {'ok' if check.ok else 'MISMATCH'}: {check.detail}")
    else:
        print(cli_text(str(explanation)))
        if check is not None:
            print(f"Autocast check: {'ok' if check.ok else 'MISMATCH'}: {check.detail}")
    return EXIT_OK if check is None or check.ok else EXIT_FAILED
