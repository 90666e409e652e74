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
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import torch.distributed as dist

_BASE = dist.TCPStore


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


class HostBoundTCPStore(_BASE):  # type: ignore[misc, valid-type]
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


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run

    install()
    run.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
