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
4. The block-scaled formats (``--blocks``, needs torchao): ``numerics(formats=all block
   formats)`` against today's fp8 what-if, ``numerics(formats=("fp8_e4m3", "fp8_e5m2"))``, and
   against the default ``numerics()``, side by side (alternating, order rotated, ``--calls``
   pairs each) on mlp/small and on a tiny Hugging Face GPT-2 built from a config; the ratios'
   medians with their range.

    python benchmarks/bench_numerics.py            # default workload (mlp, small) on CPU
    python benchmarks/bench_numerics.py --quick    # a smoke run
    python benchmarks/bench_numerics.py --threads 1   # steadier on a machine shared with others
    python benchmarks/bench_numerics.py --blocks-only --threads 1   # part 4 alone
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


BLOCK_FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4")
#: The variants part 4 times, by label: the formats each ``numerics()`` call gets.
BLOCK_VARIANTS: dict[str, tuple[str, ...] | None] = {
    "fp8 what-if": ("fp8_e4m3", "fp8_e5m2"),
    "default": None,
    "block formats": BLOCK_FORMATS,
}


def gpt2_tiny() -> tuple[Any, list[Any]] | None:
    """A tiny Hugging Face GPT-2 from a config (2 layers, width 64, vocabulary 1000) and one
    batch of 4 x 16 tokens, or None without transformers."""
    try:  # torchvision's C ops do not load beside a CPU build of torch; transformers imports
        import torchvision  # noqa: F401 - it when installed, so hide a torchvision that fails
    except (ImportError, RuntimeError):
        sys.modules["torchvision"] = None  # type: ignore[assignment]
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=2, vocab_size=1000, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 1000, (4, 16), generator=torch.Generator().manual_seed(0))
    return model, [{"input_ids": ids, "labels": ids}]


def block_pairs(target: Any, batches: Any, preset: str, calls: int) -> list[dict[str, float]]:
    """Per repeat, wall seconds of ``numerics()`` for each of :data:`BLOCK_VARIANTS` on
    ``target`` (a workload name or a module), alternating, the order rotated per repeat; one
    warm-up call each first (torchao's import included there)."""
    import precision_nb

    def once(formats: tuple[str, ...] | None) -> float:
        kwargs = {} if formats is None else {"formats": formats}
        t0 = time.perf_counter()
        precision_nb.numerics(target, batches, preset=preset, device="cpu", **kwargs)
        return time.perf_counter() - t0

    labels = list(BLOCK_VARIANTS)
    for label in labels:
        once(BLOCK_VARIANTS[label])
    out = []
    for r in range(calls):
        order = labels[r % len(labels) :] + labels[: r % len(labels)]
        out.append({label: once(BLOCK_VARIANTS[label]) for label in order})
    return out


def print_block_ratios(name: str, pairs: list[dict[str, float]]) -> None:
    for base in ("fp8 what-if", "default"):
        ratios = [p["block formats"] / p[base] for p in pairs]
        lo, hi = _iqr(ratios)
        print(
            f"{name}: numerics(all block formats) / numerics({base}): "
            f"{statistics.median(ratios):.2f} (IQR {lo:.2f}-{hi:.2f}, {len(ratios)} rotated "
            f"repeats; block formats {statistics.median(p['block formats'] for p in pairs):.2f} "
            f"s, {base} {statistics.median(p[base] for p in pairs):.2f} s)"
        )


def blocks_main(calls: int) -> None:
    """Part 4: the block formats' cost side by side with today's calls."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        print("block formats: skipped (torchao is not installed: the blocks extra)")
        return
    print_block_ratios("mlp/small", block_pairs("mlp", None, "small", calls))
    gpt2 = gpt2_tiny()
    if gpt2 is None:
        print("GPT-2 tiny: skipped (transformers is not installed)")
        return
    print_block_ratios("GPT-2 tiny", block_pairs(gpt2[0], gpt2[1], "tiny", calls))


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
    parser.add_argument(
        "--blocks-only", action="store_true", help="only part 4, the block-scaled formats' cost"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.steps, args.repeats, args.calls = 3, 2, 1
    if args.blocks_only:
        blocks_main(1 if args.quick else max(args.calls, 3))
        return 0
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
    blocks_main(1 if args.quick else max(args.calls, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
