"""``precision-nb nodes RUN_DIR``: the torchrun command that starts each node of a run.

Reads the run file ``write_spec`` wrote into RUN_DIR (a folder every node shares) and prints, for
every node, the exact command to run there (``--srun``: one ``srun`` line for a Slurm allocation).
Only argparse is imported at module level. Exit codes: 0 printed, 2 bad input (no run file).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from precision_nb.cli.main import HelpFormatter, paragraphs

    parser = subparsers.add_parser(
        "nodes",
        help="print the torchrun command of each node of a run folder (a cluster run)",
        formatter_class=HelpFormatter,
        description=paragraphs(
            "Print the command that starts each node's torchrun agent on the run file in "
            "RUN_DIR (written by precision_nb.engine.distributed.launcher.write_spec with "
            "Distributed(nnodes=N, nproc=P, rdzv_host=NODE0, rdzv_port=PORT)). Run node K's "
            "command on node K; every rank appends its log to RUN_DIR, which must be a folder "
            "all nodes share. Afterwards: precision-nb gather RUN_DIR --out REPORT.",
            "The commands run torchrun through precision_nb's entry point (torch's own "
            "torch.distributed.run, its stores bound to the rendezvous host); node 0 hosts the "
            "c10d rendezvous on the run file's rdzv_host and waits rdzv_timeout_s for the others.",
        ),
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the folder holding spec.json")
    parser.add_argument(
        "--srun",
        action="store_true",
        help="print one srun line (node rank $SLURM_NODEID) instead of one command per node",
    )
    parser.add_argument(
        "--python",
        default="python",
        help="the Python interpreter on the nodes (default: python)",
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from precision_nb.cli.main import error
    from precision_nb.core.distributed import is_loopback
    from precision_nb.engine.distributed.gather import read_spec
    from precision_nb.engine.distributed.nodes import (
        endpoint,
        node_commands,
        spec_nodes,
        srun_command,
    )

    spec_path = Path(args.run_dir).expanduser().resolve() / "spec.json"
    try:
        nodes = spec_nodes(read_spec(spec_path.parent))
        commands = node_commands(spec_path, python=args.python)
    except ValueError as exc:
        return error("nodes", exc)
    host = nodes["rdzv_host"]
    print(
        f"# {nodes['nnodes']} node(s) x {nodes['nproc_per_node']} process(es); c10d rendezvous "
        f"at {endpoint(host, nodes['rdzv_port'])} hosted by node 0, waiting "
        f"{nodes['rdzv_timeout_s']:g} s for every node"
    )
    if nodes["rdzv_port"] is None:
        print("# rdzv_port was not set in the run file: torchrun's default c10d port")
    if is_loopback(host) and nodes["nnodes"] > 1:
        print(
            f"# rdzv_host {host} is loopback: these commands start every node on THIS machine; "
            "for a cluster write the run file with Distributed(rdzv_host=<node 0's address>)"
        )
    if args.srun:
        print(srun_command(spec_path, python=args.python))
    else:
        for command in commands:
            print(f"# node {command.node}")
            print(command.shell())
    return 0
