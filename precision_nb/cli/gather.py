"""``precision-nb gather RUN_DIR --out DIR``: the report of a distributed run from its folder
(:func:`precision_nb.views.report.gather.gather_report`; what it holds: the ``--help`` text).

Only argparse is imported at module level. Exit codes: 0 written, 1 the run failed or is
incomplete (the node and rank named), 2 bad input (no run file, no rank log, an output path that
is a file).
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_OUT = "gather-out"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from precision_nb.cli.main import HelpFormatter, paragraphs

    parser = subparsers.add_parser(
        "gather",
        help="write the report of a distributed run from the ranks' logs in its folder",
        formatter_class=HelpFormatter,
        description=paragraphs(
            "Gather the ranks' logs that every node wrote into RUN_DIR (the folder of the run "
            "file; see precision-nb nodes) into the report a distributed run gets on one "
            "machine: metrics.csv, summary.csv, figures, report.html and the per-rank (and "
            "per-node) CSVs, in --out.",
            "A rank that failed, a run still going, or ranks missing from the folder end with "
            "exit code 1 and the node and rank named.",
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the folder holding spec.json")
    parser.add_argument("--out", default=DEFAULT_OUT, help="the report folder")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from precision_nb.cli.main import EXIT_FAILED, error
    from precision_nb.engine.distributed.results import DistributedError
    from precision_nb.views.report.gather import gather_report

    try:
        report = gather_report(args.run_dir, args.out)
    except DistributedError as exc:
        return error("gather", exc, EXIT_FAILED)
    except (ValueError, OSError) as exc:
        return error("gather", exc)
    print(repr(report))
    for row in next(iter(report.distributed.values())).node_table():
        print(
            f"  node {row['node']} ({row['host']}): ranks {row['ranks']}, "
            f"{row['steps_logged']} step(s) logged, final loss {row['final_loss']:.6g}"
        )
    print(f"wrote {len(report.files)} files into {args.out}/ (open report.html)")
    return 0
