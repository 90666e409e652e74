"""``torchrun`` with its stores listening on the rendezvous host only.

torchrun's rendezvous store and the store it shares with the workers are ``TCPStore`` servers,
which bind their port on every interface: ``TCPStore`` takes no bind address. It does take an
already listening socket (``master_listen_fd``). This module runs torchrun's own ``main`` (same
arguments, same agent, same process handling) after making the stores it creates as a server
listen on a socket bound to the host they are given: with the launcher's
``--rdzv-endpoint=127.0.0.1:PORT --local-addr=127.0.0.1`` both listen on loopback only.

    python -m precision_nb.engine.distributed.torchrun [torchrun arguments]

A host that does not resolve, or a port taken, raises ``RuntimeError`` like torch's own store,
so torchrun's handling of a failed store start is unchanged.

Several nodes: ``--node-rank`` must lie in ``0 .. --nnodes - 1`` (checked before anything starts;
exit code 2 with the values). torchrun's c10d rendezvous does not use the node rank (it orders
the agents itself), so this module hands it to the ranks as ``PRECISION_NB_NODE_RANK`` (with
``PRECISION_NB_NNODES``) and, when torchrun runs the worker module on a run file, records the
agent's start as ``node<K>.json`` beside that file
(:mod:`~precision_nb.engine.distributed.nodes`).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist


def listening_socket(host: str, port: int) -> int:
    """A socket bound to ``host:port`` and listening; returns its descriptor (the caller owns it).

    ``RuntimeError`` when the host does not resolve or the address cannot be bound.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise RuntimeError(f"rendezvous store: cannot resolve host {host!r}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"rendezvous store: cannot listen on {host}:{port}: {exc}") from exc
    return sock.detach()


class HostBoundTCPStore(dist.TCPStore):  # type: ignore[misc, valid-type]
    """A ``TCPStore`` whose server listens on ``host_name`` only (see the module docstring).

    Clients, and servers given their own ``master_listen_fd``, are plain ``TCPStore`` objects.
    """

    def __init__(self, host_name: str, port: int, *args: Any, **kwargs: Any) -> None:
        is_master = kwargs.get("is_master", args[1] if len(args) > 1 else False)
        fd = None
        if is_master and kwargs.get("master_listen_fd") is None:
            fd = listening_socket(host_name, port)
            kwargs["master_listen_fd"] = fd
        try:
            super().__init__(host_name, port, *args, **kwargs)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise


def install() -> None:
    """Make torchrun's elastic agent create :class:`HostBoundTCPStore` servers."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    dist.TCPStore = HostBoundTCPStore  # the agent's store and elastic utils use dist.TCPStore
    c10d_rendezvous_backend.TCPStore = HostBoundTCPStore  # imported by name there


class NodeRankError(SystemExit):
    """``--node-rank`` outside ``0 .. --nnodes - 1``: exit code 2, the message on stderr."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


def check_node(args: Any) -> tuple[int, int]:
    """(node rank, largest ``--nnodes``) of torchrun's parsed arguments; :class:`NodeRankError`
    (its message printed to stderr) for a node rank out of range."""
    from torch.distributed.run import parse_min_max_nnodes

    _, max_nodes = parse_min_max_nnodes(str(args.nnodes))
    node = int(args.node_rank)
    if not 0 <= node < max_nodes:
        message = (
            f"precision_nb torchrun: --node-rank: invalid value {node} with --nnodes="
            f"{args.nnodes}; allowed: 0 to {max_nodes - 1}"
        )
        print(message, file=sys.stderr)
        raise NodeRankError(message)
    return node, max_nodes


def _announce(args: Any, node: int, nnodes: int) -> None:
    """Tell the ranks their node, and the run folder that this node's agent started."""
    from precision_nb.engine.distributed.nodes import NNODES_ENV, NODE_RANK_ENV, write_marker

    os.environ[NODE_RANK_ENV], os.environ[NNODES_ENV] = str(node), str(nnodes)
    script_args = list(args.training_script_args)
    worker = args.module and args.training_script == "precision_nb.engine.distributed.worker"
    if worker and script_args and Path(script_args[0]).parent.is_dir():
        write_marker(Path(script_args[0]).parent, node, nnodes, str(args.nproc_per_node))


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import record

    args = run.parse_args(sys.argv[1:] if argv is None else argv)
    node, nnodes = check_node(args)
    _announce(args, node, nnodes)
    if args.rdzv_backend != "static":
        args.node_rank = 0  # a label here (see the module docstring), not torchrun's business
    install()
    record(run.run)(args)


if __name__ == "__main__":
    main()
