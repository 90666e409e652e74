"""The launcher's torchrun listens on the rendezvous host only (loopback by default).

torch's ``TCPStore`` binds every interface; ``precision_nb.engine.distributed.torchrun`` hands it
a socket bound to the host it is given. One real 2-rank run checks every listening socket of the
launcher's child processes while rank 0 trains.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

from precision_nb.core.distributed import Distributed
from precision_nb.engine.distributed import fit_distributed
from precision_nb.engine.distributed.process import _command, free_port
from precision_nb.engine.distributed.torchrun import HostBoundTCPStore, listening_socket


def _listening(pids: list[int]) -> list[tuple[int, str, str]]:
    """(pid, process name, local address) of every listening TCP socket of these processes."""
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((pid, proc.name(), conn.laddr.ip))
        except psutil.NoSuchProcess:
            continue
    return found


class SocketProbe:
    """On rank 0's first record: the listening sockets of every process the launcher started."""

    def __init__(self) -> None:
        self.sockets: list[tuple[int, str, str]] | None = None

    def on_log(self, record: dict) -> None:
        if self.sockets is None:
            children = psutil.Process().children(recursive=True)
            self.sockets = _listening([c.pid for c in children])


def test_every_listening_socket_of_a_run_is_on_loopback() -> None:
    probe = SocketProbe()
    result = fit_distributed(
        "mlp",
        distributed=Distributed("ddp", 2, timeout_s=120),
        device="cpu",
        steps=3,
        log_every=1,
        measure_peak=False,
        callbacks=[probe],
    )
    assert len(result.records) == 3
    assert probe.sockets, "no listening socket seen: the probe would prove nothing"
    names = {name for _, name, _ in probe.sockets}
    assert any("elastic" in n or "python" in n for n in names), names  # torchrun's stores
    outside = [s for s in probe.sockets if not ipaddress.ip_address(s[2]).is_loopback]
    assert not outside, f"listening beyond loopback: {outside}"


def test_the_launcher_runs_torchrun_through_the_host_bound_entry_point() -> None:
    cmd = _command(2, "127.0.0.1", Path("spec.json"))
    assert cmd[1:3] == ["-m", "precision_nb.engine.distributed.torchrun"]
    assert "--local-addr=127.0.0.1" in cmd  # the workers' store address is the same host
    assert any(a.startswith("--rdzv-endpoint=127.0.0.1:") for a in cmd)


def test_a_host_bound_store_serves_clients_on_that_host_only() -> None:
    port = free_port("127.0.0.1")
    timeout = datetime.timedelta(seconds=10)
    server = HostBoundTCPStore("127.0.0.1", port, is_master=True, timeout=timeout)
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    server.set("key", "value")
    assert client.get("key") == b"value"
    mine = [c for c in psutil.Process().net_connections(kind="inet") if c.laddr.port == port]
    listening = [c for c in mine if c.status == psutil.CONN_LISTEN]
    assert [c.laddr.ip for c in listening] == ["127.0.0.1"]


def test_a_host_that_does_not_resolve_or_a_taken_port_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="cannot resolve host 'no-such-host.invalid'"):
        listening_socket("no-such-host.invalid", 0)
    port = free_port("127.0.0.1")
    timeout = datetime.timedelta(seconds=10)
    held = HostBoundTCPStore("127.0.0.1", port, is_master=True, timeout=timeout)
    with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}"):
        listening_socket("127.0.0.1", port)
    assert held.port == port
