"""``precision-nb numerics``: what fp16, bf16, fp8 and the block-scaled formats would do to a model.

Only argparse is imported at module level; torch and the engine load inside :func:`run`, after
every flag value was checked. Prints the analysis in words and, per block format (MXFP8, MXFP4,
NVFP4; torchao's casts, the ``blocks`` extra), the summary, the layers kept in bf16, and the
what-if GPUs with their roofline estimates; ``--out`` also writes the tables as CSV and the HTML.
Exit codes: 0 success, 2 bad input (a flag value, torchao missing for a block format), 1 a failed
analysis or write, 130 interrupted.
"""

from __future__ import annotations

import argparse
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
from precision_nb.core.text import times_text

DEFAULT_FORMATS = "fp16,bf16,fp8_e4m3,fp8_e5m2"
DEFAULT_HARDWARE = "h100,h200,b200,gb200"
# The engine's names and spellings, listed here so flags are checked before torch loads (a test
# keeps them equal to engine.numerics.formats / blocks / hardware).
FORMAT_NAMES = (
    "fp16",
    "bf16",
    "fp8_e4m3",
    "fp8_e5m2",
    "mxfp8_e4m3",
    "mxfp8_e5m2",
    "mxfp4",
    "nvfp4",
)
FORMAT_ALIASES = (
    "float16", "half", "bfloat16", "e4m3", "float8_e4m3fn", "fp8_e4m3fn", "e5m2", "float8_e5m2",
    "mxfp8", "mxfp8_e4m3fn", "mx_fp8", "mx_fp8_e4m3", "mx_fp8_e5m2", "mxfp4_e2m1", "mx_fp4",
    "nvfp4_e2m1", "nv_fp4",
)  # fmt: skip
HARDWARE_NAMES = ("h100", "h200", "b200", "gb200")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "numerics",
        help="what fp16, bf16, fp8 and MXFP8 / MXFP4 / NVFP4 would do to a model's tensors",
        formatter_class=HelpFormatter,
        description=paragraphs(
            "Run one instrumented fp32 step on a copy of the model and say what each format "
            "would do to its tensors: gradient underflow and the safe fp16 loss-scale window "
            "(fp16, bf16), the per-tensor fp8 what-if, and for the block-scaled formats "
            "(mxfp8_e4m3, mxfp8_e5m2, mxfp4, nvfp4; torchao's casts, the `blocks` extra) each "
            "GEMM layer's errors, the layers to keep in bf16, which GEMMs meet the shape rules, "
            "and what-if GPUs with roofline estimates (datasheet figures, not measurements).",
            "--model and --batches load your own model as for `precision-nb profile`.",
        ),
    )
    add_source_flags(
        parser,
        "batches for --model (the first batch is used); default: the name `batches` in "
        "the factory's module",
    )
    parser.add_argument(
        "--formats",
        default=DEFAULT_FORMATS,
        metavar="FORMATS",
        help="comma-separated formats: " + ", ".join(FORMAT_NAMES),
    )
    parser.add_argument(
        "--hardware",
        default=DEFAULT_HARDWARE,
        metavar="GPUS",
        help="what-if GPUs for the block formats, comma-separated: " + ", ".join(HARDWARE_NAMES),
    )
    parser.add_argument(
        "--device", default="auto", help="auto, cpu, cuda, cuda:N, mps or another torch device"
    )
    parser.add_argument(
        "--out",
        help="also write the tables (CSV) and numerics.html into this folder; default: none",
    )
    parser.set_defaults(run=run)
    return parser


def _names(flag: str, value: str, allowed: tuple[str, ...], spellings: tuple[str, ...]) -> list:
    items = [v.strip() for v in str(value).split(",") if v.strip()]
    if not items:
        raise ValueError(f"{flag}: invalid value {value!r}; allowed: " + ", ".join(allowed))
    for item in items:
        key = item.lower().replace("-", "_").removeprefix("torch.")
        if key not in allowed and key not in spellings:
            extra = f" (aliases: {', '.join(spellings)})" if spellings else ""
            raise ValueError(
                f"{flag}: invalid value {item!r}; allowed: " + ", ".join(allowed) + extra
            )
    return items


def check_flags(args: argparse.Namespace) -> None:
    """Check the flag values and ``--out`` without importing torch (``ValueError`` naming the
    flag)."""
    from precision_nb.core.names import device_string
    from precision_nb.views.report.folder import check_output_folder

    check_source(args)
    args.formats = _names("--formats", args.formats, FORMAT_NAMES, FORMAT_ALIASES)
    args.hardware = _names("--hardware", args.hardware, HARDWARE_NAMES, ())
    device_string(args.device, "--device")
    if args.out is not None:
        check_output_folder(Path(args.out).expanduser(), "--out")


def _text(analysis: Any, hardware: list[str]) -> str:
    """The analysis in words and, for block formats, the kept layers and the what-if GPUs."""
    from precision_nb.views.report.markup import fmt

    lines = [repr(analysis)]
    info = analysis.result.blocks_info
    if info and not info.get("reason"):
        rule = next(iter(info["keep"].values()))["rule"]
        lines.append(rule[:1].upper() + rule[1:] + ".")
        for name, keep in info["keep"].items():
            kept = "; ".join(f"{k['layer']} ({', '.join(k['reasons'])})" for k in keep["keep"])
            lines.append(f"  {name} keeps in bf16: {kept or 'no layer'}")
        frame = analysis.hardware(hardware)
        lines.append(f"What-if GPUs ({frame.attrs['assumptions']}):")
        for r in frame.to_dict("records"):
            native = r["runs"] == "native"
            peak = f", datasheet {fmt(r['datasheet_tflops'])} TFLOP/s" if native else ""
            speed = r["speedup_estimate"]
            est = ""
            if speed == speed and speed:  # not NaN, not 0
                est = f"; estimated GEMM speedup over bf16 {times_text(speed)}"
            lines.append(f"  {r['hardware']} {r['format']}: {r['runs']}{peak}{est}")
    return "\n".join(lines)


def _write(analysis: Any, hardware: list[str], out: Path) -> list[str]:
    from precision_nb.views.report.markup import page

    out.mkdir(parents=True, exist_ok=True)
    tables = {
        "numerics.csv": analysis.gradients,
        "numerics_blocks.csv": analysis.blocks,
        "numerics_gemms.csv": analysis.gemms,
    }
    if analysis.result.blocks_info:
        frame = analysis.hardware(hardware)
        tables["numerics_hardware.csv"] = frame
        tables["numerics_hardware_layers.csv"] = frame.attrs["per_layer"]
    for name, table in tables.items():
        table.to_csv(out / name, index=False)
    html = page("Numerics", [cli_text(analysis._repr_html_())])
    (out / "numerics.html").write_text(html, encoding="utf-8")
    return [*tables, "numerics.html"]


def run(args: argparse.Namespace) -> int:
    try:
        check_flags(args)
    except ValueError as err:
        return error("numerics", err)
    from precision_nb.views.report.numerics import numerics

    try:
        model, batches, preset = target(args)
        result = numerics(model, batches, formats=args.formats, device=args.device, preset=preset)
    except (ValueError, ImportError) as err:  # bad input; torchao missing for a block format
        return error("numerics", err)
    except RuntimeError as err:  # the step failed: out of memory, ...
        return error("numerics", f"failed: {err}", EXIT_FAILED)
    except Exception as err:  # noqa: BLE001 - your model's own error: its type, message, line
        return run_failed("numerics", err)
    print(cli_text(_text(result, args.hardware)))
    if args.out is not None:
        try:
            files = _write(result, args.hardware, Path(args.out).expanduser())
        except OSError as err:
            return error("numerics", f"cannot write {args.out!r}: {err}", EXIT_FAILED)
        print(f"wrote {len(files)} files into {args.out}/ (open numerics.html)")
    return 0
