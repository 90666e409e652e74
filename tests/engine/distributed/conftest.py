"""The shared torchrun launches of the distributed tests: each run once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def one_node(tmp_path_factory):
    """2 DDP processes on one node (dist_runs.py, beside this file), run once per session."""
    from dist_runs import launch

    return launch(tmp_path_factory.mktemp("one-node"), nproc=2)


@pytest.fixture(scope="session")
def two_nodes(tmp_path_factory):
    """The same 2 ranks as two nodes of one process each, run once per session."""
    from dist_runs import launch

    return launch(tmp_path_factory.mktemp("two-nodes"), nproc=1, nnodes=2)
