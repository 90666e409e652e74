"""The ``precision-nb`` command line: ``plan`` (core only) and ``profile`` (the main job).

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` and
``run(args) -> int``; this module only wires them together, so ``precision-nb plan`` never imports
matplotlib.
Exit codes: 0 success, 2 bad input (a clear message on stderr), 1 a failed run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS = ("plan", "profile", "inspect")

# ``--fused`` of every subcommand: auto probes (null), true attempts, false disables.
FUSED = {"auto": None, "null": None, "none": None, "true": True, "false": False}


def fused_arg(value: str) -> str:
    """argparse type of ``--fused``: any case and surrounding space; the key of :data:`FUSED`."""
    key = value.strip().lower()
    if key not in FUSED:
        raise argparse.ArgumentTypeError(
            f"invalid value {value!r}; allowed: auto (probe), true (attempt), false (disable)"
        )
    return key


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="precision-nb",
        description="PyTorch mixed precision you can see: resolve plans and profile them.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    sub.required = True
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"precision_nb.cli.{name}")
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
