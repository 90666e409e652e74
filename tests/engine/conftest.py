"""Small models and batches shared by the engine tests (tiny, CPU, a few milliseconds each)."""

from __future__ import annotations

import pytest
import torch
from torch import nn


@pytest.fixture
def linear_data():
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(64, 8, generator=gen)
    ys = (xs.sum(dim=1) > 0).long()
    return xs, ys


@pytest.fixture
def make_model():
    def build(seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

    return build


@pytest.fixture
def batches(linear_data):
    xs, ys = linear_data

    def batch(i: int):
        j = (i % 8) * 8
        return xs[j : j + 8], ys[j : j + 8]

    return batch


@pytest.fixture(scope="session")
def one_node(tmp_path_factory):
    """2 DDP processes on one node (tests/engine/dist_runs.py), run once per session."""
    from dist_runs import launch

    return launch(tmp_path_factory.mktemp("one-node"), nproc=2)


@pytest.fixture(scope="session")
def two_nodes(tmp_path_factory):
    """The same 2 ranks as two nodes of one process each, run once per session."""
    from dist_runs import launch

    return launch(tmp_path_factory.mktemp("two-nodes"), nproc=1, nnodes=2)
