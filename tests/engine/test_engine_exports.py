"""The engine's public names load lazily from ``precision_nb``."""

from __future__ import annotations

import json
import subprocess
import sys

import precision_nb
from precision_nb.core.distributed import (
    CLUSTER_PRESETS,
    Distributed,
    expected_comm_bytes,
    ring_seconds,
)
from precision_nb.engine.callbacks import Callback
from precision_nb.engine.distributed.results import DistributedError
from precision_nb.engine.entry import fit
from precision_nb.engine.inspect.policy import autocast_policy
from precision_nb.engine.precision import Precision
from precision_nb.engine.request import RunRequest
from precision_nb.engine.results import FitError, LossScaleFloorError
from precision_nb.engine.session import FitSession

NAMES = {
    "FitSession": FitSession,
    "Precision": Precision,
    "Callback": Callback,
    "RunRequest": RunRequest,
    "fit": fit,
    "FitError": FitError,
    "LossScaleFloorError": LossScaleFloorError,
    "Distributed": Distributed,
    "CLUSTER_PRESETS": CLUSTER_PRESETS,
    "expected_comm_bytes": expected_comm_bytes,
    "ring_seconds": ring_seconds,
    "DistributedError": DistributedError,
    "autocast_policy": autocast_policy,
}


def test_the_names_are_the_engine_objects():
    for name, obj in NAMES.items():
        assert getattr(precision_nb, name) is obj and name in precision_nb.__all__
    assert issubclass(precision_nb.LossScaleFloorError, FitError)
    assert not hasattr(precision_nb, "ComparisonError")  # a plan's own error is raised


def test_importing_the_package_loads_none_of_them():
    code = (
        "import json, sys, precision_nb; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('precision_nb.engine'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
