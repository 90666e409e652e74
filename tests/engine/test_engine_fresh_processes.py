"""Fresh measuring processes: a notebook's model travels to them by value, the fork server's
children are processes of their own, and a bad start method is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from precision_nb.engine import fork_server

ROOT = Path(__file__).resolve().parents[2]

NOTEBOOK_CELL = textwrap.dedent(
    """
    import json, os
    import torch
    from torch import nn
    from precision_nb.engine.compare import compare
    from precision_nb.engine.measure import MeasureConfig

    class Net(nn.Module):  # defined here, in __main__, as in a notebook cell
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    def batches(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)

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


def test_a_start_method_other_than_fork_or_exec_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(fork_server.ENV_START, "spawn")
    with pytest.raises(ValueError, match="PRECISION_NB_FRESH_START: invalid value 'spawn'; "):
        fork_server.starter({}, tmp_path)


@pytest.mark.skipif(not fork_server.fork_is_safe(), reason="fork without exec is Linux-only")
def test_forked_children_are_processes_of_their_own_with_threads_that_work(tmp_path):
    """Two children of one server: each its own pid, its torch thread pool started by itself
    (a matmul on two threads finishes), its layout shifted by its own random draw."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        textwrap.dedent(
            """
            import json, os, sys, time
            import torch
            from precision_nb.engine import fork_server

            def main(argv):
                kept = fork_server._shift_layout()
                torch.set_num_threads(2)
                x = torch.randn(256, 256)
                t = time.perf_counter()
                (x @ x).sum().item()
                out = {"pid": os.getpid(), "threads": torch.get_num_threads(),
                       "mmap": len(kept[0]), "heap": len(kept[1]),
                       "seconds": time.perf_counter() - t}
                open(argv[0], "w").write(json.dumps(out))
                return 0
            """
        ),
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    server = fork_server.ForkServer(env, tmp_path)
    try:
        seen = []
        for k in range(2):
            out = tmp_path / f"out{k}.json"
            child = server.launch(out, tmp_path / f"err{k}", target="probe:main")
            code = None
            for _ in range(600):
                if (code := child.poll(0.1)) is not None:
                    break
            assert code == 0, (tmp_path / f"err{k}").read_text()
            seen.append(json.loads(out.read_text()))
            assert seen[-1]["pid"] == child.pid
    finally:
        server.close()
    assert server.proc.returncode == 0
    assert seen[0]["pid"] != seen[1]["pid"] and all(s["threads"] == 2 for s in seen)
    assert all(s["mmap"] >= 4096 for s in seen)
    assert (seen[0]["mmap"], seen[0]["heap"]) != (seen[1]["mmap"], seen[1]["heap"])
