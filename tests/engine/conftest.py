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
