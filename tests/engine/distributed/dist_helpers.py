"""Models and batches that torchrun workers import by path in the distributed tests.

``FaultyMLP`` does something on one rank at one forward call (counting the engine's FLOP-count
pass as call 1): multiply its output by inf (an fp16 overflow the grad scaler must catch on every
rank), raise, or kill its own process. ``rank="node1"`` picks the rank(s) of the node started
with ``--node-rank 1`` instead of a global rank (torchrun's c10d rendezvous orders the nodes
itself).
"""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist
from torch import nn

BATCH = 8


class FaultyMLP(nn.Module):
    def __init__(self, action: str, rank: int | str, call: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        self.action, self.rank, self.call, self.calls = action, rank, call, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = self.net(x)
        if self.calls == self.call and self._mine():
            if self.action == "inf":
                return out * torch.tensor(float("inf"), dtype=out.dtype)
            if self.action == "raise":
                raise ArithmeticError(f"rank {self.rank} failed on purpose at call {self.call}")
            if self.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        return out

    def _mine(self) -> bool:
        if self.rank == "node1":
            return os.environ.get("PRECISION_NB_NODE_RANK") == "1"
        return dist.get_rank() == self.rank


def raise_on_node1() -> nn.Module:
    return FaultyMLP("raise", rank="node1", call=4)


def overflow_on_rank1() -> nn.Module:
    return FaultyMLP("inf", rank=1, call=4)


def raise_on_rank1() -> nn.Module:
    return FaultyMLP("raise", rank=1, call=4)


def kill_rank1() -> nn.Module:
    return FaultyMLP("kill", rank=1, call=4)


def plain() -> nn.Module:
    return FaultyMLP("none", rank=-1, call=0)


def batches():
    gen = torch.Generator().manual_seed(0)
    pool = [(torch.randn(BATCH, 4, generator=gen), torch.randint(0, 3, (BATCH,), generator=gen))]
    return lambda i: pool[i % len(pool)]


def odd_batches():
    return lambda i: (torch.randn(BATCH - 1, 4), torch.zeros(BATCH - 1, dtype=torch.long))
