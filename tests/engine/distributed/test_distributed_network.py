"""The launcher's torchrun listens on the rendezvous host only (loopback by default).

torch's ``TCPStore`` binds every interface; ``precision_nb.engine.distributed.torchrun`` hands it
a socket bound to the host it is given. Real 2-rank runs (one node of two processes, and two nodes
of one process each: two torchrun agents) check every listening socket of the launcher's child
processes, polled from a thread for as long as the run goes on.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist
from dist_runs import STEPS

from precision_nb.core.distributed import Distributed
from precision_nb.engine.distributed.process import agent_commands, free_port
from precision_nb.engine.distributed.torchrun import HostBoundTCPStore, listening_socket


def _on_loopback_only(probe) -> None:
    assert probe.sockets, "no listening socket seen: the probe would prove nothing"
    names = {name for _, name, _ in probe.sockets}
    assert any("elastic" in n or "python" in n for n in names), names  # torchrun's stores
    outside = [s for s in probe.sockets if not ipaddress.ip_address(s[2]).is_loopback]
    assert not outside, f"listening beyond loopback: {outside}"


def test_every_listening_socket_of_a_run_is_on_loopback(one_node) -> None:
    assert len(one_node.result.records) == STEPS
    _on_loopback_only(one_node.probe)


def test_every_listening_socket_of_a_two_node_run_is_on_loopback(two_nodes) -> None:
    assert len(two_nodes.result.records) == STEPS
    agents = [c for c in two_nodes.probe.cmdlines if "distributed.torchrun" in c]
    assert len(agents) == 2, agents  # both nodes' agents were running when the probe looked
    _on_loopback_only(two_nodes.probe)
    # every process the two agents started was seen, the ranks of both nodes among them
    ranks = [c for c in two_nodes.probe.cmdlines if "distributed.worker" in c and "-u" in c]
    assert len(ranks) >= 2, two_nodes.probe.cmdlines


def test_the_launcher_runs_torchrun_through_the_host_bound_entry_point() -> None:
    (cmd,) = agent_commands(Distributed("ddp", 2), Path("spec.json"), 29500)
    assert cmd.argv[1:3] == ("-m", "precision_nb.engine.distributed.torchrun")
    assert "--local-addr=127.0.0.1" in cmd.argv  # the workers' store address is the same host
    assert "--rdzv-endpoint=127.0.0.1:29500" in cmd.argv
    nodes = agent_commands(Distributed("ddp", 1, nnodes=2), Path("spec.json"), 29500)
    assert [c.node for c in nodes] == [0, 1]
    for c in nodes:  # every node of a loopback run listens on loopback, node 0 hosts the store
        assert "--local-addr=127.0.0.1" in c.argv and f"--node-rank={c.node}" in c.argv
        conf = next(a for a in c.argv if a.startswith("--rdzv-conf="))
        assert f"is_host={int(c.node == 0)}" in conf
        assert c.env.get("GLOO_SOCKET_IFNAME", "").startswith("lo")


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
