"""Cost of the numerics tools: in-training gradient underflow stats, and a full ``numerics()`` call.

1. A plain training step (fp32 forward, backward, AdamW step, zero_grad) of the default workload
   against the same step followed by ``grad_underflow_stats`` on every gradient (the worst case,
   ``grad_stats_every=1``). The two variants alternate within each repeat, their order rotated,
   each timed over ``--steps`` steps after a warm-up; the ratio is the median of the per-repeat
   ratios, printed with its interquartile range (how much the machine moved while measuring).
   Collecting every N steps costs about ``1 + (ratio - 1) / N`` of a plain step.
2. The engine's own option: ``fit()`` with ``TrainConfig(grad_stats_every=N)`` for N = 1 and
   10 against the same fit without it, paired and rotated the same way; each fit's mean step
   time (``RunResult.step_times_s``, which includes the stats; the mean, since with N = 10 only
   one step in ten pays) is compared.
3. ``precision_nb.numerics()`` on the same workload (median of ``--calls`` calls), also as a
   multiple of one plain step.

    python benchmarks/bench_numerics.py            # default workload (mlp, small) on CPU
    python benchmarks/bench_numerics.py --quick    # a smoke run
    python benchmarks/bench_numerics.py --threads 1   # steadier on a machine shared with others
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

from precision_nb.engine.numerics.training import grad_underflow_stats
from precision_nb.engine.trainer import TrainConfig, Trainer
from precision_nb.engine.workloads import DEFAULT_PRESET, DEFAULT_WORKLOAD, get_workload


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if out.dim() == 3:
        return torch.nn.functional.cross_entropy(
            out[:, :-1].reshape(-1, out.shape[-1]), y[:, 1:].reshape(-1)
        )
    return torch.nn.functional.cross_entropy(out, y)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_times(
    workload: str, preset: str, steps: int, repeats: int, device: str = "cpu"
) -> list[tuple[float, float, float]]:
    """Per repeat: seconds per plain step, per step with the stats, and in the stats call alone
    (timed inside the second variant, synchronised on CUDA)."""
    dev = torch.device(device)
    torch.manual_seed(0)
    wl = get_workload(workload, preset)
    model = wl.make_model().to(dev)
    batches = wl.make_batches(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = [p for p in model.parameters() if p.requires_grad]
    scale = torch.tensor([65536.0], device=dev)
    kept: list[Any] = []

    def run(with_stats: bool, n: int, start: int) -> tuple[float, float]:
        inside = 0.0
        _sync(dev)
        t0 = time.perf_counter()
        for i in range(start, start + n):
            x, y = batches(i)
            _loss(model(x), y).backward()
            if with_stats:
                _sync(dev)
                t1 = time.perf_counter()
                kept.append(grad_underflow_stats([p.grad for p in params], scale))
                _sync(dev)
                inside += time.perf_counter() - t1
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(dev)
        return (time.perf_counter() - t0) / n, inside / n

    run(False, 3, 0)
    run(True, 3, 0)
    out = []
    for r in range(repeats):
        order = (False, True) if r % 2 == 0 else (True, False)
        times = {v: run(v, steps, r * steps) for v in order}
        out.append((times[False][0], times[True][0], times[True][1]))
        kept.clear()
    return out


def fit_step_times(
    workload: str,
    preset: str,
    steps: int,
    repeats: int,
    every: tuple[int | None, ...] = (None, 1, 10),
    device: str = "cpu",
) -> list[dict[int | None, float]]:
    """Per repeat: the mean step time of a fit for each ``grad_stats_every`` in ``every`` (the
    fits alternate, their order rotated per repeat; one warm-up fit each first)."""
    wl = get_workload(workload, preset)
    batches = wl.make_batches(torch.device(device))

    def mean_step(n: int | None, count: int) -> float:
        cfg = TrainConfig(
            steps=count, log_every=count, grad_stats_every=n, progress=False, measure_peak=False
        )
        trainer = Trainer(wl.make_model(), batches, device=device, precision="fp32", train=cfg)
        return statistics.fmean(trainer.fit().step_times_s)

    for n in every:
        mean_step(n, 3)
    out = []
    for r in range(repeats):
        order = every[r % len(every) :] + every[: r % len(every)]
        out.append({n: mean_step(n, steps) for n in order})
    return out


def numerics_seconds(workload: str, preset: str, calls: int, device: str = "cpu") -> list[float]:
    """Wall seconds of ``precision_nb.numerics()`` calls (the first, warming up, left out)."""
    import precision_nb

    out = []
    for i in range(calls + 1):
        t0 = time.perf_counter()
        precision_nb.numerics(workload, preset=preset, device=device)
        if i:
            out.append(time.perf_counter() - t0)
    return out


def _iqr(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=DEFAULT_WORKLOAD)
    parser.add_argument("--preset", default=DEFAULT_PRESET)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="few steps and repeats")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.steps, args.repeats, args.calls = 3, 2, 1
    pairs = step_times(args.workload, args.preset, args.steps, args.repeats, args.device)
    ratios = [s / p for p, s, _ in pairs]
    alone = [a / p for p, _, a in pairs]
    plain = statistics.median(p for p, _, _ in pairs)
    lo, hi = _iqr(ratios)
    r = statistics.median(ratios)
    a_lo, a_hi = _iqr(alone)
    a = statistics.median(alone)
    print(
        f"{args.workload}/{args.preset} on {args.device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"plain step: {plain * 1e3:.2f} ms (median of {len(pairs)} repeats x {args.steps})")
    print(
        f"step + grad_underflow_stats / plain step: {r:.3f} (IQR {lo:.3f}-{hi:.3f}, "
        f"{len(ratios)} paired repeats)"
    )
    print(
        f"grad_underflow_stats alone / plain step: {a:.3f} (IQR {a_lo:.3f}-{a_hi:.3f}); "
        f"collected every 10 steps: ~{1 + a / 10:.3f} of a plain step"
    )
    fits = fit_step_times(args.workload, args.preset, args.steps, args.repeats, device=args.device)
    for n in (1, 10):
        rs = [f[n] / f[None] for f in fits]
        f_lo, f_hi = _iqr(rs)
        print(
            f"fit(grad_stats_every={n}) / fit() step time: {statistics.median(rs):.3f} "
            f"(IQR {f_lo:.3f}-{f_hi:.3f}, {len(rs)} rotated repeats of {args.steps}-step fits)"
        )
    secs = numerics_seconds(args.workload, args.preset, args.calls, args.device)
    med = statistics.median(secs)
    print(f"numerics(): {med:.2f} s (median of {len(secs)} calls) = {med / plain:.0f} plain steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
