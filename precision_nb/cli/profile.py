"""``precision-nb profile``: run a comparison of precision plans and write a report folder.

Only argparse is imported at module level; the engine, matplotlib and pandas load inside
:func:`run`, so ``precision-nb plan`` and ``--help`` stay fast.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from precision_nb.cli.main import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    FUSED,
    HelpFormatter,
    cli_text,
    error,
    fused_arg,
    paragraphs,
    run_failed,
)
from precision_nb.cli.user_model import user_model
from precision_nb.core.defaults import (
    ALLOCATOR_POLICIES,
    CONFIDENCE,
    DEFAULT_ALLOCATOR,
    DEFAULT_BUDGET_S,
    DEFAULT_COMPARE,
    DEFAULT_PRESET,
    DEFAULT_ROUNDS,
    DEFAULT_STEPS,
    DEFAULT_TARGET,
    DEFAULT_WORKLOAD,
    MIN_ROUNDS,
    PRESET_NAMES,
    WORKLOAD_NAMES,
)
from precision_nb.core.text import confidence_text

DEFAULT_OUT = "profile-out"
#: How the command line says the confidence of an interval ("95 %").
PCT = confidence_text(CONFIDENCE).replace("%", "%%")
STRATEGIES = ("ddp", "fsdp2")
COMM_HOOKS = ("none", "fp16", "bf16")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "profile",
        help="measure a model under several precision plans and write a report",
        formatter_class=HelpFormatter,
        description=paragraphs(
            "Train a built-in workload (or your own model, --model) under each requested "
            "precision plan from the same initial weights: a warm-up per plan, then the plans "
            "interleaved in rounds. Writes metrics.csv, summary.csv (speedups with "
            f"{PCT.replace('%%', '%')} "
            "intervals), PNG figures and a self-contained report.html into --out. Requests that "
            "resolve to the same plan run once.",
            "The report is staged inside --out and moved into place only when complete: Ctrl-C "
            "(exit 130), a failed run (exit 1) or a full disk (exit 1) leaves --out as it was.",
        ),
    )
    parser.add_argument(
        "--model",
        metavar="MODULE:FACTORY",
        help="profile your own model: package.module:factory, a callable returning an "
        "nn.Module (the current folder is importable); replaces --workload; default: none",
    )
    parser.add_argument(
        "--batches",
        metavar="MODULE:NAME",
        help="batches for --model: a list, a DataLoader, a callable of the microbatch index, or "
        "a callable without arguments returning one of those; default: the name `batches` in "
        "the factory's module",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help=f"interleaved rounds the measured steps are split over, in each process; more than "
        f"--steps are refused (default: {DEFAULT_ROUNDS}, or one per step when fewer steps are "
        "measured)",
    )
    parser.add_argument(
        "--processes",
        metavar="N",
        help="processes that measure the plans: 1 (this one only) or N (this one and N-1 fresh "
        "ones); default: fresh ones are added until --target or --budget",
    )
    parser.add_argument(
        "--target",
        default=str(DEFAULT_TARGET),
        metavar="FRACTION",
        help="stop adding processes when every speedup interval's half-width is within this "
        "fraction (0.05 = ±5 %%); none: measure until the budget is spent",
    )
    parser.add_argument(
        "--budget",
        default=DEFAULT_BUDGET_S,  # not a string: the default, told apart from --budget 40
        metavar="SECONDS",
        help="wall-clock seconds the measurement may take (warm-ups, rounds, processes); "
        "none: no limit",
    )
    parser.add_argument(
        "--allocator",
        default=DEFAULT_ALLOCATOR,
        choices=ALLOCATOR_POLICIES,
        help="settled: glibc malloc's thresholds set alike in every measuring process, as a "
        "long-running process settles them (default); as-is: left as each process finds them",
    )
    parser.add_argument(
        "--workload",
        default=DEFAULT_WORKLOAD,
        help="built-in workload: mlp, transformer (alias lm), cnn",
    )
    parser.add_argument(
        "--preset", default=DEFAULT_PRESET, help="size preset: tiny, small, medium, large"
    )
    parser.add_argument(
        "--compare",
        default=",".join(DEFAULT_COMPARE),
        metavar="MODES",
        help="comma-separated precision requests (auto, fp32, bf16, fp16, and true plans: "
        "bf16-true, fp16-true, with +stochastic or +kahan)",
    )
    parser.add_argument(
        "--device", default="auto", help="auto, cpu, cuda, cuda:N, mps or another torch device"
    )
    parser.add_argument(
        "--compile",
        default="off",
        metavar="MODES",
        help="torch.compile modes, comma-separated: off, default, reduce-overhead, max-autotune; "
        "every --compare request is measured under each (off,default: eager and compiled, "
        "plans labelled bf16 and bf16+compile); the compile step is reported apart",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help="measured optimizer steps per plan (warm-up not included)",
    )
    parser.add_argument(
        "--accumulation", type=int, default=1, help="microbatches per optimizer step"
    )
    parser.add_argument(
        "--fused",
        type=fused_arg,
        default="auto",
        help="fused AdamW: auto (probe), true (attempt), false (disable)",
    )
    parser.add_argument(
        "--loss-scale-lab",
        action="store_true",
        help="allow fp16 with a CPU GradScaler to watch loss scaling without a GPU",
    )
    for flag, part in (
        ("--no-inspect", "the memory-by-kind and op dtype inspection of each plan"),
        ("--no-numerics", "the gradient underflow analysis and the fp16 scale window"),
        ("--no-time-split", "the profiled steps that split each plan's step time by op family"),
    ):
        parser.add_argument(flag, action="store_true", help=f"leave out {part}")
    parser.add_argument(
        "--nproc",
        type=int,
        help="measure the plans on N processes, all in one torchrun launch, by the same "
        "interleaved method (the slowest rank's time per step; docs/distributed.md); "
        "default: one process",
    )
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        help="with --nproc: ddp (full replicas) or fsdp2 (sharded); default: ddp",
    )
    parser.add_argument(
        "--comm-hook",
        choices=COMM_HOOKS,
        help="with --nproc and ddp: gradient compression of the all-reduce; default: none",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    # Accepted only to be refused with a reason (argparse would just say "unrecognized").
    parser.add_argument("--simulate", nargs="?", const="", default=None, help=argparse.SUPPRESS)
    parser.set_defaults(run=run)
    return parser


def check_flags(args: argparse.Namespace) -> None:
    """Check every flag value and ``--out`` without importing torch (``ValueError``)."""
    from pathlib import Path

    from precision_nb.core.names import compile_list, device_string, precision_list
    from precision_nb.core.remedies import check_flag
    from precision_nb.core.validate import MAX_STEPS, choice, positive_int
    from precision_nb.engine.measure_config import check_options, check_rounds
    from precision_nb.views.report.folder import check_output_folder

    choice("--workload", str(args.workload).strip().lower(), WORKLOAD_NAMES)
    choice("--preset", str(args.preset).strip().lower(), PRESET_NAMES)
    check_flag(precision_list(args.compare, "--compare"), "--compare")
    compile_list(args.compile, "--compile")
    device_string(args.device, "--device")
    positive_int("--steps", args.steps, MAX_STEPS)
    positive_int("--accumulation", args.accumulation)
    if args.rounds is not None:
        positive_int("--rounds", args.rounds)
        check_rounds(args.rounds, args.steps, ("--rounds", "--steps"))

    args.processes = _optional_number("--processes", args.processes, int)
    args.target = _optional_number("--target", args.target, float)
    args.budget = budget_of(args.budget)
    flags = ("--processes", "--target", "--budget", "--model")  # how its errors name them
    check_options(args.processes, args.target, args.budget, None, flags)
    if args.nproc is not None:
        positive_int("--nproc", args.nproc)
    for flag, value in (("--strategy", args.strategy), ("--comm-hook", args.comm_hook)):
        if value is not None and args.nproc is None:
            raise ValueError(f"{flag}: given without --nproc; it applies to a distributed profile")
    check_output_folder(Path(args.out).expanduser(), "--out")


@contextlib.contextmanager
def _ctrl_c_stops(stop: threading.Event) -> Iterator[None]:
    """First Ctrl-C: set ``stop`` (the run ends after its current step). Second: interrupt now."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print(
            "precision-nb profile: stopping after this step; --out is left as it was (Ctrl-C "
            "again to abort now)",
            file=sys.stderr,
        )

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except KeyboardInterrupt:  # wherever it lands: nothing was moved into --out
        print(
            f"precision-nb profile: interrupted; {str(args.out)!r} was left as it was",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    if args.simulate is not None:
        return error(
            "profile",
            "--simulate is not available for profile: nothing can train on simulated hardware. "
            "Use `precision-nb plan --simulate PRESET` to see the plan a machine would get.",
        )
    try:
        check_flags(args)
    except (ValueError, OSError) as err:
        return error("profile", err)
    from precision_nb.engine.measure_config import block_sizes
    from precision_nb.engine.results import partial_result
    from precision_nb.views.report.profile import (
        ReportWriteError,
        output_folder,
        profile_request,
        run_profile,
    )

    try:
        if args.model is not None and args.workload != DEFAULT_WORKLOAD:
            raise ValueError("--model and --workload: give one of them")
        model, batches = user_model(args.model, args.batches)
        request = profile_request(
            args.workload if model is None else model, batches, None, args.compare,
            rounds=args.rounds, preset=args.preset, device=args.device, steps=args.steps,
            accumulation=args.accumulation, fused=FUSED[args.fused],
            loss_scale_lab=args.loss_scale_lab, progress=not args.no_progress,
            inspect=not args.no_inspect, numerics=not args.no_numerics,
            time_split=not args.no_time_split,
            distributed=_distributed(args), processes=args.processes, target=args.target,
            budget_s=args.budget, rebuild=_rebuild(args), compile=args.compile,
            allocator=args.allocator,
        )  # fmt: skip
        out = output_folder(args.out)
    except (ValueError, RuntimeError) as err:
        return error("profile", err)
    rounds = len(block_sizes(request.train.steps, request.measure.rounds))
    if rounds < MIN_ROUNDS and args.processes == 1:
        print(
            f"precision-nb profile: {rounds} rounds in one process are below the {MIN_ROUNDS} "
            f"rounds a {PCT.replace('%%', '%')} interval needs: the verdicts give the raw "
            "per-round ratios instead",
            file=sys.stderr,
        )

    command = "precision-nb " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else ""
    settings, stop = {"command": command.strip()}, threading.Event()
    try:
        with _ctrl_c_stops(stop):
            output = run_profile(request, out=out, settings=settings, stop=stop, wording=cli_text)
    except ReportWriteError as err:
        return error("profile", err.strerror, EXIT_FAILED)
    except Exception as err:  # noqa: BLE001 - a failed run or a bad value is said; others raise
        if partial_result(err) is not None or isinstance(err, (RuntimeError, OSError)):
            return run_failed("profile", err)  # raised in a run (your code's error included)
        if isinstance(err, ValueError):
            return error("profile", err)
        raise
    _print_outcome(output)
    failures = getattr(output.comparison, "failures", None) or {}
    for label, why in failures.items():
        print(
            f"precision-nb profile: plan {label} {cli_text(why)}; the report covers what it "
            "completed",
            file=sys.stderr,
        )
    return EXIT_FAILED if failures else EXIT_OK


def budget_of(value: Any) -> float | None:
    """``--budget`` as seconds: the default budget itself when the flag was not given (so a
    profile of ``--processes N`` tells it from ``--budget 40``), None for "none"."""
    return _optional_number("--budget", value, float)


def _optional_number(flag: str, value: Any, kind: type) -> Any:
    """A flag's text as a number of ``kind``, or None for "none" (no target, no time limit)."""
    if value is None or isinstance(value, (int, float)):
        return value
    if str(value).strip().lower() == "none":
        return None
    try:
        return kind(value)
    except ValueError:
        allowed = "an integer" if kind is int else "a number"
        raise ValueError(f"{flag}: invalid value {value!r}; allowed: {allowed} or none") from None


def _rebuild(args: argparse.Namespace) -> tuple[str, str] | None:
    """The import paths fresh measuring processes rebuild ``--model`` and its batches from."""
    if args.model is None:
        return None
    return args.model, args.batches or f"{args.model.partition(':')[0]}:batches"


def _distributed(args: argparse.Namespace) -> Any:
    """The ``Distributed`` request of ``--nproc`` / ``--strategy`` / ``--comm-hook``, or None."""
    if args.nproc is None:
        return None
    from precision_nb.core.distributed import Distributed

    return Distributed(
        strategy=args.strategy or "ddp", nproc=args.nproc, comm_hook=args.comm_hook or "none"
    )


def _print_outcome(output: Any) -> None:
    """One line per plan, the verdict first (merged requests under their plan), then the
    table, the other hints and where the report is; a busy machine is said before any figure."""
    from precision_nb.views.report import tables as col
    from precision_nb.views.report.answer import other_hints, terminal_lines

    if output.load_note:
        print(cli_text(output.load_note))
    plans = output.answers()
    for line in terminal_lines(plans):
        print(cli_text(line))
    stopped = output.comparison.method.get("measurement stopped by")
    if stopped:  # what ended the measurement, once (the verdicts say how many processes)
        print(cli_text(f"measurement stopped by {stopped}"))
    table = output.summary
    columns = [
        c
        for c in (
            "run",
            "final_loss",
            col.MEDIAN_STEP,
            col.STEP_IQR,
            col.SPEEDUP,
            col.CI_LOW,
            col.CI_HIGH,
            col.WARMUP_STEPS,
            col.PEAK_MIB,
            col.SKIPPED,
            "fused_adamw",
            col.ALSO_REQUESTED,
        )
        if c in table
    ]
    print(table[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for hint in other_hints(output.hints, plans):
        print(f"hint: {cli_text(hint.text(output.out_dir))}")
    print(f"wrote {len(output.files)} files into {output.out_dir}/ (open report.html)")
