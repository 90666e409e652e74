"""``precision-nb plan``: print the resolved plan and the decisions behind it.

Module-level imports stay light (argparse only); torch and the core load when the command runs.
Flags override the values of ``--config``. Bad input prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from precision_nb.cli.main import FUSED, fused_arg


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan",
        help="resolve device and precision and explain every decision",
        description=(
            "Resolve a device and precision request to the plan the trainer would use, with the "
            "ordered decisions, the resolution-matrix row and warnings. Flags override --config."
        ),
    )
    parser.add_argument("--device", help="auto (default), cpu, cuda, cuda:N, mps")
    parser.add_argument("--mode", help="auto (default), fp32, bf16, fp16")
    parser.add_argument("--dtype", help="fp32, bf16 or fp16; counts only when the mode is auto")
    parser.add_argument(
        "--fused", type=fused_arg, help="fused AdamW: auto (probe, default), true, false"
    )
    parser.add_argument(
        "--simulate",
        metavar="PRESET",
        help=(
            "explain for simulated hardware: this-machine, cpu-only, cuda-bf16, "
            "cuda-bf16-emulated, cuda-no-bf16, cuda-bf16-error, mps"
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="YAML file: device, precision, optimizer")
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
        help="opt in to CPU fp16 with a CPU GradScaler (outside the resolution rules)",
    )
    parser.set_defaults(run=run)
    return parser


def _explain(args: argparse.Namespace) -> Any:
    from dataclasses import replace

    from precision_nb.core.capabilities import get_capabilities
    from precision_nb.core.config import RunConfig, load_config
    from precision_nb.core.plan import PrecisionConfig
    from precision_nb.core.resolution import explain_precision

    cfg = load_config(args.config) if args.config else RunConfig()
    precision = cfg.precision
    overrides: dict[str, Any] = {}
    if args.mode is not None:
        overrides["mode"] = args.mode
    if args.dtype is not None:
        overrides["dtype"] = args.dtype
    if args.loss_scale_lab is not None:
        overrides["loss_scale_lab"] = args.loss_scale_lab
    if overrides:
        precision = PrecisionConfig(**{**precision.to_dict(), **overrides})
    optimizer = cfg.optimizer
    if args.fused is not None:
        optimizer = replace(optimizer, fused=FUSED[args.fused])
    device = args.device if args.device is not None else cfg.device
    caps = get_capabilities(args.simulate)
    return explain_precision(precision, device, capabilities=caps, optimizer=optimizer)


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
        explanation = _explain(args)
        check = _verify(explanation) if getattr(args, "verify", False) else None
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"precision-nb plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        data = explanation.to_dict()
        if check is not None:
            data["autocast_check"] = check.to_dict()
        print(json.dumps(data, indent=2))
    else:
        print(explanation)
        if check is not None:
            print(f"Autocast check: {'ok' if check.ok else 'MISMATCH'}: {check.detail}")
    return 0 if check is None or check.ok else 1
