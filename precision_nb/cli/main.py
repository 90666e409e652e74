"""The ``precision-nb`` command line: ``plan`` (core only), ``profile`` (the main job), ``inspect``.

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` and
``run(args) -> int``; this module wires them together and owns what every command shares: exit
codes, error lines, CLI spellings in messages, Ctrl-C and a closed output pipe. Flag values are
checked before torch is imported, so a bad value is answered at once.

Exit codes: 0 success, 1 a failed run, 2 bad input or usage (one line on stderr), 130 interrupted
(Ctrl-C), 141 the reader of the output went away (``precision-nb plan --json | head -1``).
"""

from __future__ import annotations

import argparse
import contextlib
import html
import importlib
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from precision_nb import __version__

SUBCOMMANDS = ("plan", "profile", "inspect", "numerics", "nodes", "gather")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 130, 141

# ``--fused`` of every subcommand: auto probes (null), true attempts, false disables.
FUSED = {"auto": None, "null": None, "none": None, "true": True, "false": False}

#: Python and config spellings in library messages -> what a command-line user types.
CLI_SPELLINGS: tuple[tuple[str, str], ...] = (
    ("PrecisionConfig(mode='fp16', loss_scale_lab=True)", "--mode fp16 --loss-scale-lab"),
    ("loss_scale_lab=True", "--loss-scale-lab"),
    ("optimizer.fused=null", "--fused auto"),
    ("optimizer.fused=true", "--fused true"),
    ("optimizer.fused=false", "--fused false"),
    ("optimizer.fused: invalid value True", "--fused: invalid value true"),
    ("optimizer.fused: invalid value False", "--fused: invalid value false"),
    ("fused None or False", "--fused auto or false"),
    ("fused None or True", "--fused auto or true"),
    ("no remedy with fused True", "no remedy with --fused true"),
    ("fused=None", "--fused auto"),
    ("fused=True", "--fused true"),
    ("fused=False", "--fused false"),
)


def cli_text(text: str) -> str:
    """``text`` with the Python spellings of :data:`CLI_SPELLINGS` replaced by flags (in plain
    text, and as they appear HTML-escaped in a page, so a report the CLI writes says it too)."""
    for python, flag in CLI_SPELLINGS:
        text = text.replace(python, flag)
        escaped = html.escape(python)
        if escaped != python:
            text = text.replace(escaped, html.escape(flag))
    return text


def error(command: str, message: Any, code: int = EXIT_USAGE) -> int:
    """Print ``precision-nb COMMAND: error: MESSAGE`` on stderr; return ``code``."""
    print(f"precision-nb {command}: error: {cli_text(str(message))}", file=sys.stderr)
    return code


def run_failed(command: str, exc: BaseException) -> int:
    """Print ``precision-nb COMMAND: run failed: ...`` for a run that raised ``exc``; returns
    :data:`EXIT_FAILED`. The product's own failure reads as its message; an error raised inside
    the run by your code or torch (one carrying a partial result, or of a type the product never
    raises) with its type, the plan of a comparison that raised it, and the last line outside
    torch and precision_nb that it passed through (your code, usually)."""
    from precision_nb.engine.results import FitError, partial_result

    text, partial = str(exc), partial_result(exc)
    product = isinstance(exc, (RuntimeError, ValueError, OSError)) and partial is None
    if not (product or isinstance(exc, FitError)):
        text = f"{type(exc).__name__}: {text}{_raised_at(exc)}"
    failed = getattr(partial, "failures", None) or {}
    if failed:  # a comparison raises its first failing plan's error
        text = f"plan {next(iter(failed))}: {text}"
    print(f"precision-nb {command}: run failed: {cli_text(text)}", file=sys.stderr)
    return EXIT_FAILED


def _raised_at(exc: BaseException) -> str:
    import traceback
    from pathlib import Path

    import torch

    inside = (str(Path(torch.__file__).parent), str(Path(__file__).parents[1]))  # precision_nb
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(inside)
    ]
    if not frames:
        return ""
    last = frames[-1]
    return f" (raised at {last.filename}:{last.lineno} in {last.name})"


def fused_arg(value: str) -> str:
    """argparse type of ``--fused``: any case and surrounding space; the key of :data:`FUSED`."""
    key = value.strip().lower()
    if key not in FUSED:
        raise argparse.ArgumentTypeError(
            f"invalid value {value!r}; allowed: auto (probe), true (attempt), false (disable)"
        )
    return key


def paragraphs(*texts: str) -> str:
    """A ``--help`` description: each text wrapped to 80 columns, a blank line between them."""
    return "\n\n".join(textwrap.fill(text, 80) for text in texts)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default (unless the help already names it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or action.default is argparse.SUPPRESS
            or "default" in text
            or isinstance(action, (argparse._HelpAction, argparse._VersionAction))
        ):
            return text
        if action.default in (None, False) and action.nargs == 0:
            return f"{text} (default: off)"
        if action.default is None:
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="precision-nb",
        description="PyTorch mixed precision you can see: resolve plans and profile them.",
        epilog="Exit codes: 0 ok, 1 a run failed, 2 bad input, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    sub.required = True
    for name in SUBCOMMANDS:
        importlib.import_module(f"precision_nb.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors exit 2; --help and --version exit 0
    try:
        code = int(args.run(args))
        sys.stdout.flush()
    except KeyboardInterrupt:
        print(f"precision-nb {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout to /dev/null, so the exit flush cannot fail again
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no real file (a test's)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
