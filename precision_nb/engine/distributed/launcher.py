"""``fit_distributed``: start the ranks with ``torchrun`` (a subprocess), follow rank 0 live and
gather every rank's records.

The calling process (a notebook kernel, a script, the CLI) is the launcher, never a rank. It picks a
free port on the rendezvous host (loopback by default), runs torchrun through
``python -m precision_nb.engine.distributed.torchrun`` (torch's ``torch.distributed.run`` with its
stores listening on that host only) with ``--max-restarts 0``, reads the ranks' JSON-line logs
while they train (rank 0's records go to the callbacks as they are logged), and at the end makes
sure no worker outlives the run: torchrun is stopped with SIGTERM (which it forwards), then its
process group and any worker it recorded are killed by id.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from precision_nb.core.distributed import (
    LOOPBACK,
    Distributed,
    DistributedPlan,
    explain_distributed,
)
from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.distributed.parallel import batch_samples, check_divisible
from precision_nb.engine.distributed.results import (
    DistributedError,
    DistributedResult,
    RankResult,
    merge_records,
    read_rank_log,
)
from precision_nb.engine.distributed.worker import import_path
from precision_nb.engine.trainer import make_train_config
from precision_nb.engine.workloads import WORKLOADS, Workload, get_workload

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


def _model_spec(
    model: Any, batches: Any, preset: str, factory: str | None, run_dir: Path, nproc: int
) -> tuple[dict[str, Any], str | None]:
    """How workers rebuild the model (and batches), checked here before anything starts."""
    how = (
        "a model object from this process cannot be sent to torchrun workers: pass a built-in "
        "workload name, or 'package.module:factory' (a function returning the model) with "
        "batches='package.module:function', or the model together with factory=... (its state "
        "dict is saved and loaded into the factory's model on every rank)"
    )
    if isinstance(model, Workload):
        if model.name not in WORKLOADS:
            raise ValueError(f"model: workload {model.name!r} is not built in; {how}")
        model, preset = model.name, model.preset
    if isinstance(model, str) and ":" not in model:
        wl = get_workload(model, preset)
        if batches is not None:
            raise ValueError("batches: must be None with a built-in workload (it brings its own)")
        check_divisible(
            wl.info["batch_size"], nproc, f"workload {wl.name!r} at preset {wl.preset!r}"
        )
        return {"workload": wl.name, "preset": wl.preset}, None
    spec: dict[str, Any]
    if isinstance(model, str):
        spec = {"factory": model}
    elif isinstance(model, nn.Module):
        if factory is None:
            raise ValueError(f"model: {type(model).__name__} given without factory; {how}")
        path = run_dir / "model_state.pt"
        torch.save(model.state_dict(), path)
        spec = {"factory": factory, "state_dict": str(path)}
    else:
        raise ValueError(f"model: invalid value of type {type(model).__name__}; {how}")
    import_path(spec["factory"])  # importable here, so most likely on the workers too
    if not isinstance(batches, str):
        raise ValueError(
            f"batches: invalid value of type {type(batches).__name__} for a factory model; "
            "allowed: 'package.module:function' returning the global batches (an iterable or "
            "a callable taking the microbatch index)"
        )
    from precision_nb.engine.batches import BatchSource

    first = BatchSource(import_path(batches)()).get(0)
    check_divisible(batch_samples(first), nproc, f"the first batch of {batches!r}")
    return spec, batches


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


def _failure(result: DistributedResult, log_text: str, returncode: int) -> DistributedError:
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


def write_spec(
    model: nn.Module | Workload | str,
    batches: Any = None,
    *,
    distributed: Distributed | None = None,
    preset: str = "tiny",
    device: Any = "auto",
    precision: PrecisionConfig | str | None = None,
    optimizer: OptimizerConfig | None = None,
    train: Any = None,
    factory: str | None = None,
    loss_fn: str | None = None,
    run_dir: str | Path | None = None,
    **train_options: Any,
) -> tuple[DistributedPlan, Path]:
    """Resolve and check a run, write the workers' ``spec.json`` to ``run_dir`` (a new temporary
    folder by default) and return the plan and that file's path; nothing is started.

    ``fit_distributed`` starts torchrun on it; for several nodes, run
    ``torchrun ... -m precision_nb.engine.distributed.worker SPEC`` on each (docs/distributed.md).
    """
    req = distributed if distributed is not None else Distributed()
    if loss_fn is not None and not isinstance(loss_fn, str):
        raise ValueError(
            f"loss_fn: invalid value of type {type(loss_fn).__name__}; allowed: None or "
            "'package.module:function' (a function object cannot be sent to torchrun workers)"
        )
    if loss_fn is not None:
        import_path(loss_fn)
    cfg = make_train_config(train, train_options)
    if cfg.inspect:
        raise ValueError(
            "train.inspect: invalid value True with a distributed run; allowed: False (a model "
            "wrapped for several processes is not inspected: inspect the single-process model "
            "with precision_nb.inspect, or fit without distributed)"
        )
    prec = (
        precision
        if isinstance(precision, PrecisionConfig)
        else PrecisionConfig(mode=precision if precision is not None else "auto")
    )
    opt = optimizer if optimizer is not None else OptimizerConfig()
    plan = explain_distributed(req, prec, device, optimizer=opt)  # RuntimeError before start
    fresh = run_dir is None
    folder = Path(tempfile.mkdtemp(prefix="precision_nb_dist_")) if fresh else Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        model_spec, batches_path = _model_spec(model, batches, preset, factory, folder, req.nproc)
    except BaseException:
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    spec = {
        "run_dir": str(folder),
        "model": model_spec,
        "batches": batches_path,
        "loss_fn": loss_fn,
        "device": plan.device_type,
        "timeout_s": req.timeout_s,
        "precision": prec.to_dict(),
        "optimizer": opt.to_dict(),
        "train": asdict(cfg),
        "plan": {
            "strategy": plan.strategy,
            "backend": plan.backend,
            "param_dtype": plan.param_dtype,
            "reduce_dtype": plan.reduce_dtype,
            "output_dtype": plan.output_dtype,
            "comm_hook": plan.comm_hook,
            "count_collectives": req.count_collectives,
        },
    }
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    return plan, spec_path


def fit_distributed(
    model: nn.Module | Workload | str,
    batches: Any = None,
    *,
    distributed: Distributed | None = None,
    preset: str = "tiny",
    device: Any = "auto",
    precision: PrecisionConfig | str | None = None,
    optimizer: OptimizerConfig | None = None,
    train: Any = None,
    factory: str | None = None,
    loss_fn: str | None = None,
    callbacks: Iterable[Any] = (),
    stop: Any = None,
    **train_options: Any,
) -> DistributedResult:
    """Train on ``distributed.nproc`` processes launched by torchrun; see the module docstring.

    ``model``: a built-in workload (name or :class:`Workload`, with ``preset``), a
    ``"package.module:factory"`` path (with ``batches="package.module:function"``), or an
    ``nn.Module`` with ``factory=`` (its state dict travels in a file); ``loss_fn`` likewise as
    ``"package.module:function"``. Every batch is a global
    batch; each rank trains its 1/nproc slice. ``callbacks`` get rank 0's records live
    (``on_log(record)``) and ``on_fit_end(result)``. Raises :class:`DistributedError` (every
    rank's records kept, the failing rank's error in the message) when a rank fails.
    """
    plan, spec_path = write_spec(
        model,
        batches,
        distributed=distributed,
        preset=preset,
        device=device,
        precision=precision,
        optimizer=optimizer,
        train=train,
        factory=factory,
        loss_fn=loss_fn,
        **train_options,
    )
    return _launch(plan, spec_path, spec_path.parent, list(callbacks), stop)


def _launch(
    plan: Any, spec_path: Path, run_dir: Path, callbacks: list[Any], stop: Any
) -> DistributedResult:
    req = plan.request
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
    seen = 0
    rank0 = run_dir / "rank0.jsonl"
    try:
        while proc.poll() is None:
            if stop is not None and stop.is_set() and not stopped:
                stopped = True
                _stop(proc)
            if time.time() - t0 > req.timeout_s and not stopped:
                stopped = True
                log.warning("distributed run timed out after %.0f s; stopping it", req.timeout_s)
                _stop(proc)
            seen = _follow(rank0, seen, callbacks)
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        stopped = True
        _stop(proc)
    ranks = [read_rank_log(run_dir / f"rank{r}.jsonl", r) for r in range(req.nproc)]
    if stopped:
        _stopped_not_failed(ranks)
    _reap(proc, ranks, spec_path)
    _follow(rank0, seen, callbacks)
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    result = DistributedResult(
        plan=plan,
        ranks=ranks,
        records=merge_records(ranks),
        seconds=time.time() - t0,
        stopped=stopped or any(r.stopped for r in ranks),
        log_tail=log_text[-4000:],
        run_dir=str(run_dir),
    )
    starts = [r.t_fit_start for r in ranks]
    if all(s is not None for s in starts):
        result.startup_s = max(starts) - t0  # type: ignore[type-var]
    if proc.returncode != 0 or any(r.error or not r.finished for r in ranks):
        if not (stopped and all(r.finished or r.error is None for r in ranks)):
            shutil.rmtree(run_dir, ignore_errors=True)  # records and log tail are in the error
            raise _failure(result, log_text, proc.returncode)
    for cb in callbacks:
        if hasattr(cb, "on_fit_end"):
            cb.on_fit_end(result)
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _stopped_not_failed(ranks: list[Any]) -> None:
    """After a stop the caller asked for, a rank interrupted by the SIGTERM that torchrun forwards
    (wherever it landed: in a step, in a collective, at teardown) stopped; it did not fail."""
    for rank in ranks:
        if rank.error is not None and rank.error.get("type") == "KeyboardInterrupt":
            rank.error = None
            rank.finished = True
            if rank.result is not None:
                rank.result = {**rank.result, "stopped": True}


def _follow(path: Path, seen: int, callbacks: list[Any]) -> int:
    """Hand rank 0's records logged since the last call to the callbacks; returns the count."""
    if not callbacks or not path.exists():
        return seen
    records = read_rank_log(path, 0).records
    for rec in records[seen:]:
        for cb in callbacks:
            if hasattr(cb, "on_log"):
                cb.on_log(rec)
    return len(records)
