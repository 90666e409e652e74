"""Cost of the distributed path: the counting layer's per-step overhead and the start-up time.

**Overhead.** Inside one torchrun job of 2 CPU ranks (gloo), two identical DDP replicas of the
same workload train side by side: one over the counting group, one over the plain default group.
They alternate in blocks of ``--block`` steps, the order flipping every round, so both see the
same machine state; the ratio of each round's step times (counted / plain) is paired, and the
median over rounds is printed with its interquartile range (how much the machine moved).

The layer's own cost is also measured where model noise cannot hide it: 1-element all-reduces
through each group, interleaved in blocks; the difference per call, divided by the plain DDP
step time times the collective calls DDP makes per step (counted), is the implied per-step ratio.

**Time in flight.** The counting layer's seconds from a collective's call to its completion,
against a hand-timed loop: each synchronous 4 MB all-reduce through the counting group is also
timed with the host clock around the call (which returns once the work is done); the median
ratio (layer's figure / hand-timed) over the calls, with its IQR.

**Start-up.** ``fit_distributed`` of the tiny MLP for one step, ``--startup-runs`` times: the
seconds from launching torchrun until every rank enters its fit loop, and the whole call; the
median and the range over the runs are printed (the machine's load moves them). The same two
ranks as two "nodes" (two torchrun agents of one process each, a c10d rendezvous on loopback)
alternate with the one-node runs, so both see the same machine; their ratio is printed too.

    python benchmarks/bench_distributed.py             # mlp small, 2 ranks
    python benchmarks/bench_distributed.py --quick     # fewer rounds (a smoke run)

Target: counted / plain <= 1.02 per DDP step; start-up of 2 CPU ranks < 15 s on one node,
< 20 s as two nodes.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from precision_nb.engine.distributed.counting import CommCounter, counting_group
from precision_nb.engine.workloads import get_workload


def ddp_step(model: nn.Module, opt: torch.optim.Optimizer, batch: Any) -> None:
    x, y = batch
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def paired_rounds(
    preset: str, rounds: int, block: int, rank: int, world: int
) -> tuple[list[float], int]:
    """Per-round ratios (counted / plain step time) and the bytes counted per step."""
    wl = get_workload("mlp", preset)
    torch.manual_seed(0)
    base = wl.make_model()
    counter = CommCounter()
    groups = {"plain": dist.group.WORLD, "counted": counting_group(counter)}
    models = {k: nn.parallel.DistributedDataParallel(copy.deepcopy(base), process_group=g)
              for k, g in groups.items()}  # fmt: skip
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}
    batches = wl.make_batches("cpu")
    n = wl.info["batch_size"] // world

    def block_time(name: str, start: int) -> float:
        t0 = time.perf_counter()
        for i in range(block):
            x, y = batches(start + i)
            ddp_step(
                models[name],
                opts[name],
                (x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]),
            )
        return (time.perf_counter() - t0) / block

    for name in models:  # warm-up (DDP rebuilds its buckets after the first iterations)
        block_time(name, 0)
    counter.take()
    ratios: list[float] = []
    plain: list[float] = []
    for r in range(rounds):
        order = ["plain", "counted"] if r % 2 == 0 else ["counted", "plain"]
        t = {name: block_time(name, r * block) for name in order}
        ratios.append(t["counted"] / t["plain"])
        plain.append(t["plain"])
    paired_rounds.last_plain_step_s = statistics.median(plain)  # type: ignore[attr-defined]
    rows = counter.take()
    per_step = sum(row["bytes"] for row in rows) // (rounds * block)
    paired_rounds.calls_per_step = sum(r["calls"] for r in rows) / (rounds * block)  # type: ignore[attr-defined]
    return ratios, per_step


def per_call_overhead(calls: int, block: int = 100) -> tuple[float, float]:
    """Seconds per 1-element all-reduce through the counting group and through the plain group,
    interleaved in blocks (the medians of the blocks): the layer's own cost, free of model noise."""
    counted = counting_group(CommCounter())
    t = torch.zeros(1)
    times: dict[str, list[float]] = {"plain": [], "counted": []}
    for i in range(max(2, calls // block)):
        order = ["plain", "counted"] if i % 2 == 0 else ["counted", "plain"]
        for name in order:
            group = dist.group.WORLD if name == "plain" else counted
            t0 = time.perf_counter()
            for _ in range(block):
                dist.all_reduce(t, group=group)
            times[name].append((time.perf_counter() - t0) / block)
    return statistics.median(times["counted"]), statistics.median(times["plain"])


def in_flight_check(calls: int, numel: int = 1 << 20) -> list[float]:
    """Per call: the counting layer's in-flight seconds of one synchronous 4 MB all-reduce
    divided by the seconds of the same call timed by hand around it (host clock)."""
    counter = CommCounter()
    counted = counting_group(counter)
    t = torch.ones(numel)
    ratios = []
    for _ in range(calls):
        t0 = time.perf_counter()
        dist.all_reduce(t, group=counted)
        by_hand = time.perf_counter() - t0
        dist.barrier()  # the completion callback has run once the next collective starts
        rows = counter.take()
        if rows and rows[0]["timed_calls"] == 1:
            ratios.append(rows[0]["seconds"] / by_hand)
    return ratios


def median_iqr(values: list[float]) -> str:
    """'median (IQR q1-q3' of the values (the caller closes the parenthesis)."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{statistics.median(values):.3f} (IQR {q[0]:.3f}-{q[2]:.3f}"


def worker(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ratios, per_step = paired_rounds(args.preset, args.rounds, args.block, rank, world)
    counted_s, plain_s = per_call_overhead(args.calls)
    step_s = paired_rounds.last_plain_step_s  # type: ignore[attr-defined]
    calls = paired_rounds.calls_per_step  # type: ignore[attr-defined]
    flight = in_flight_check(max(10, args.calls // 50))
    if rank == 0:
        if flight:
            print(
                "counting layer, time in flight of a 4 MB all-reduce / hand-timed call: "
                f"{median_iqr(flight)}, {len(flight)} calls)",
                flush=True,
            )
        else:
            print("counting layer, time in flight: no timed call (no future)", flush=True)
        extra = counted_s - plain_s
        print(
            f"counting layer, per collective call: {extra * 1e6:+.1f} us ({counted_s * 1e6:.1f} vs "
            f"{plain_s * 1e6:.1f} us for a 1-element all-reduce, medians of interleaved blocks); "
            f"with {calls:g} collective call(s) per DDP step of {step_s * 1e3:.1f} ms the implied "
            f"ratio is {1 + calls * max(extra, 0.0) / step_s:.4f}",
            flush=True,
        )
        print(
            f"counting layer, mlp {args.preset}, {world} ranks, gloo: counted / plain DDP step = "
            f"{median_iqr(ratios)}, {len(ratios)} paired rounds of {args.block} steps); "
            f"{per_step} bytes counted per step",
            flush=True,
        )
    dist.destroy_process_group()


def startup(nnodes: int = 1) -> tuple[float, float]:
    """(launch -> every rank in its fit loop, the whole call) of a 1-step fit of 2 ranks: one
    node of 2 processes, or ``nnodes=2`` nodes of 1 process each."""
    from precision_nb.core.distributed import Distributed
    from precision_nb.engine.distributed.launcher import fit_distributed

    t0 = time.perf_counter()
    result = fit_distributed(
        "mlp",
        distributed=Distributed("ddp", 2 // nnodes, nnodes=nnodes),
        device="cpu",
        steps=1,
        measure_peak=False,
    )
    return float(result.startup_s or 0.0), time.perf_counter() - t0


def startup_line(what: str, runs: list[tuple[float, float]], target: str) -> str:
    """One printed line of start-up figures: medians and ranges over the runs."""
    ups, totals = [r[0] for r in runs], [r[1] for r in runs]
    return (
        f"start-up, {what}, mlp tiny: {statistics.median(ups):.1f} s from launch to every "
        f"rank's fit loop (range {min(ups):.1f}-{max(ups):.1f} s), "
        f"{statistics.median(totals):.1f} s for the whole 1-step fit_distributed call (range "
        f"{min(totals):.1f}-{max(totals):.1f} s); medians of {len(runs)} runs, target {target}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--calls", type=int, default=4000, help="all-reduce calls per group")
    p.add_argument("--startup-runs", type=int, default=3, help="start-up measurements")
    p.add_argument("--quick", action="store_true", help="6 rounds of 5 steps, 1 start-up run")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.block, args.calls, args.startup_runs = 6, 5, 400, 1
    if args.worker:
        worker(args)
        return 0
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={args.nproc}", __file__, "--worker", f"--preset={args.preset}",
        f"--rounds={args.rounds}", f"--block={args.block}", f"--calls={args.calls}",
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("counting layer")]
    print("\n".join(lines) if lines else f"overhead run failed:\n{done.stderr[-3000:]}")
    one: list[tuple[float, float]] = []
    two: list[tuple[float, float]] = []
    for i in range(args.startup_runs):  # alternate, the order flipping, so both see the machine
        for nnodes in (1, 2) if i % 2 == 0 else (2, 1):
            (one if nnodes == 1 else two).append(startup(nnodes))
    print(startup_line("2 CPU ranks on one node", one, "< 15 s"))
    print(startup_line("2 nodes x 1 CPU rank (two torchrun agents, loopback)", two, "< 20 s"))
    ratios = [b[0] / a[0] for a, b in zip(one, two, strict=True) if a[0] > 0]
    if ratios:
        print(
            f"start-up, two nodes / one node (paired runs): {median_iqr(ratios)}, "
            f"{len(ratios)} pairs)"
        )
    return 0 if lines and done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
