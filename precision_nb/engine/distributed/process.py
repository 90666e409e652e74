"""torchrun as a subprocess: start it on a spec, follow it, stop it, and describe a failure.

:func:`run_torchrun` picks a free port on the rendezvous host (loopback by default), runs torchrun
through ``python -m precision_nb.engine.distributed.torchrun`` (torch's ``torch.distributed.run``
with its stores listening on that host only) with ``--max-restarts 0``, calls ``poll()`` while the
ranks train (the launcher follows their JSON-line logs there) and at the end makes sure no worker
outlives the run: torchrun is stopped with SIGTERM (which it forwards), then its process group and
any worker it recorded are killed by id. :func:`failure` turns a failed run into a
``DistributedError`` naming the rank that failed first.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from precision_nb.core.distributed import LOOPBACK, Distributed
from precision_nb.engine.distributed.results import (
    DistributedError,
    DistributedResult,
    RankResult,
    merge_records,
    read_rank_log,
)

__all__ = [
    "TorchrunRun",
    "exit_codes",
    "failure",
    "free_port",
    "root_cause",
    "run_torchrun",
    "stopped_not_failed",
]

log = logging.getLogger(__name__)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
_POLL_S = 0.05
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


def free_port(host: str) -> int:
    """A port the OS reports free on ``host`` (bound and released at once)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _loopback_interface() -> str | None:
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n.startswith("lo")), None)


def _endpoint(host: str) -> str:
    return f"[{host}]:{free_port(host)}" if ":" in host else f"{host}:{free_port(host)}"


def _command(nproc: int, host: str, spec_path: Path) -> list[str]:
    return [
        sys.executable, "-m", "precision_nb.engine.distributed.torchrun",
        "--nnodes=1", f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={_endpoint(host)}", f"--local-addr={host}",
        "--max-restarts=0", "--monitor-interval=0.1",
        "-m", "precision_nb.engine.distributed.worker", str(spec_path),
    ]  # fmt: skip


def _environment(host: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [_PACKAGE_ROOT, os.getcwd(), *[p for p in sys.path if p]]
    if env.get("PYTHONPATH"):
        paths.insert(1, env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    lo = _loopback_interface()
    if host in (LOOPBACK, "localhost", "::1") and lo is not None:
        env.setdefault("GLOO_SOCKET_IFNAME", lo)
        env.setdefault("NCCL_SOCKET_IFNAME", lo)
    return env


def _stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to the workers
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("torchrun did not stop within %.0f s after SIGTERM; killing it", grace_s)


def _reap(proc: subprocess.Popen, ranks: list[RankResult], spec_path: Path) -> None:
    """Kill torchrun's process group and any recorded worker still running (by id)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already: nothing to kill
    proc.wait()
    for r in ranks:
        if r.pid is None:
            continue
        try:
            p = psutil.Process(r.pid)
            if str(spec_path) in " ".join(p.cmdline()):
                p.kill()
                p.wait(5)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue


def exit_codes(log_text: str) -> dict[int, int]:
    """Each failed rank's exit code from torchrun's failure report (negative: killed by signal)."""
    pattern = r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)"
    return {int(r): int(c) for r, c in re.findall(pattern, log_text)}


def _describe(r: RankResult, exit_code: int | None) -> str:
    if r.error is not None:
        frames = [
            ln.strip()
            for ln in (r.error.get("traceback") or "").splitlines()
            if ln.strip().startswith('File "')
        ]
        outside = [f for f in frames if _TORCH_DIR not in f]
        where = f" ({(outside or frames)[-1]})" if frames else ""
        return f"raised {r.error.get('type')}: {r.error.get('message')}{where}"
    if exit_code is not None and exit_code < 0:
        name = signal.Signals(-exit_code).name if -exit_code in signal.valid_signals() else "?"
        return f"was killed by signal {name} (exit code {exit_code}) and left no error"
    if not r.finished:
        return f"ended without a result (exit code {exit_code})"
    return "finished"


def root_cause(ranks: list[RankResult], codes: dict[int, int]) -> int | None:
    """The rank that failed first: one that ended with neither a result nor an error (killed),
    else the earliest recorded error, else the first rank torchrun reports."""
    killed = [r.rank for r in ranks if not r.finished and r.error is None]
    if killed:
        return min(killed, key=lambda k: (codes.get(k, 0) >= 0, k))
    errors = [r for r in ranks if r.error is not None]
    if errors:
        return min(errors, key=lambda r: r.error["t"]).rank  # type: ignore[index]
    return min(codes) if codes else None


def failure(result: DistributedResult, log_text: str, returncode: int) -> DistributedError:
    codes = exit_codes(log_text)
    root = root_cause(result.ranks, codes)
    lines = [f"distributed run failed (torchrun exit code {returncode})"]
    if root is not None:
        lines[0] += f": rank {root} {_describe(result.ranks[root], codes.get(root))}"
    for r in result.ranks:
        if r.rank != root:
            state = _describe(r, codes.get(r.rank))
            lines.append(f"  rank {r.rank}: {len(r.records)} record(s) kept; {state}")
    lines.append("every rank's records are in error.result.ranks")
    result.error = lines[0]
    return DistributedError("\n".join(lines), result, root)


@dataclass
class TorchrunRun:
    """How one torchrun ended: exit code, its log, whether it was stopped, when it started."""

    returncode: int
    log_text: str
    stopped: bool
    t0: float
    seconds: float
    run_dir: Path

    def failed(self, ranks: list[RankResult]) -> bool:
        """A rank failed (not the SIGTERM of a stop the caller asked for)."""
        if self.returncode == 0 and not any(r.error or not r.finished for r in ranks):
            return False
        return not (self.stopped and all(r.finished or r.error is None for r in ranks))

    def result(self, plan: Any, ranks: list[RankResult]) -> DistributedResult:
        """A DistributedResult of ``ranks`` (all the run's ranks, or their lines of one plan)."""
        result = DistributedResult(
            plan=plan,
            ranks=ranks,
            records=merge_records(ranks),
            seconds=self.seconds,
            stopped=self.stopped or any(r.stopped for r in ranks),
            log_tail=self.log_text[-4000:],
            run_dir=str(self.run_dir),
        )
        starts = [r.t_fit_start for r in ranks]
        if starts and all(s is not None for s in starts):
            result.startup_s = max(starts) - self.t0  # type: ignore[type-var]
        return result


def run_torchrun(
    req: Distributed, spec_path: Path, run_dir: Path, stop: Any, poll: Any
) -> TorchrunRun:
    """Run torchrun on ``spec_path`` until it ends, calling ``poll()`` every few ms (to follow the
    ranks' logs); stop it on ``stop``, Ctrl-C or ``req.timeout_s``; no worker outlives it."""
    log_path = run_dir / "torchrun.log"
    t0 = time.time()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            _command(req.nproc, req.rdzv_host, spec_path),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_environment(req.rdzv_host),
            start_new_session=True,
        )
    stopped = False
    try:
        while proc.poll() is None:
            if stop is not None and stop.is_set() and not stopped:
                stopped = True
                _stop(proc)
            if time.time() - t0 > req.timeout_s and not stopped:
                stopped = True
                log.warning("distributed run timed out after %.0f s; stopping it", req.timeout_s)
                _stop(proc)
            poll()
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        stopped = True
        _stop(proc)
    ranks = [read_rank_log(run_dir / f"rank{r}.jsonl", r) for r in range(req.nproc)]
    _reap(proc, ranks, spec_path)
    poll()
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    return TorchrunRun(proc.returncode, log_text, stopped, t0, time.time() - t0, run_dir)


def stopped_not_failed(ranks: list[Any]) -> None:
    """After a stop the caller asked for, a rank interrupted by the SIGTERM that torchrun forwards
    (wherever it landed: in a step, in a collective, at teardown) stopped; it did not fail."""
    for rank in ranks:
        if rank.error is not None and rank.error.get("type") == "KeyboardInterrupt":
            rank.error = None
            rank.finished = True
            if rank.result is not None:
                rank.result = {**rank.result, "stopped": True}
