"""Fresh measuring processes: a notebook's model travels to them by value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from notebook_cell import CELL

ROOT = Path(__file__).resolve().parents[2]

# a script whose __main__ defines the model, as a notebook cell does, then compares it
NOTEBOOK_CELL = CELL + textwrap.dedent(
    """
    import json, os
    from precision_nb.engine.compare import compare
    from precision_nb.engine.measure import MeasureConfig

    cfg = MeasureConfig(rounds=2, warmup_min=2, warmup_max=2, processes=2)
    out = compare(["fp32", "bf16"], model=Net(), batches=batches, steps=4, log_every=4,
                  loss_fn=lambda out, y: nn.functional.cross_entropy(out.float(), y),
                  progress=False, measure=cfg)
    m = out.measurement
    print(json.dumps({
        "module": Net.__module__, "processes": m.process_count, "stopped_by": m.stopped_by,
        "pids": [p.pid for p in m.processes], "me": os.getpid(),
        "blocks": [len(p.plans["bf16"].blocks) for p in m.processes],
        "events": [e.message for e in m.events], "level": out.outcome("bf16").speedup.level,
    }))
    """
)


def test_a_model_defined_in_main_is_measured_in_fresh_processes(tmp_path):
    script = tmp_path / "cell.py"
    script.write_text(NOTEBOOK_CELL, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["module"] == "__main__"
    assert got["processes"] == 2 and got["level"] == "processes", got["stopped_by"]
    assert got["stopped_by"].startswith("2 processes, as asked")
    assert got["pids"][0] != got["me"] and got["blocks"] == [2]
    assert any(
        e.startswith("model, batches, loss_fn sent to the fresh processes by value")
        for e in got["events"]
    )
