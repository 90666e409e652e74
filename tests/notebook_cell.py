"""A notebook cell's model and batches, for the tests of what travels to fresh processes: its
classes and functions belong to ``__main__``, which a fresh process does not have (cloudpickle
sends them by value)."""

from __future__ import annotations

CELL = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

def batches(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
"""


def notebook_cell() -> dict:
    """The cell run as a notebook runs it: its names in a ``__main__`` namespace."""
    namespace: dict = {"__name__": "__main__"}
    exec(CELL, namespace)  # noqa: S102 - the test's own source, run as a notebook cell runs
    assert namespace["Net"].forward.__module__ == "__main__"
    return namespace
