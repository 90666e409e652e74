"""Step time of ``Trainer.fit()`` against a minimal hand-written torch loop and Accelerate's loop.

Same model weights, data, plan (autocast dtype) and optimizer (plain AdamW) for all three; every
loop logs the loss every 10 steps. Variants are interleaved, their order rotated every repeat,
each timed over a run of steps after a warm-up; a ratio is the median over repeats of the ratio
measured within one repeat (paired, so the machine's slow drifts cancel).

The ratios compare per-step time over runs long enough for a step to dominate (200 steps on the
tiny preset, 30 on small). What a ``fit()`` call costs once, whatever its length (seeding, the
FLOP-count cache lookup, memory probe, records), is measured on its own and printed as
"setup ms": a 1-step fit minus a 1-step hand loop, so it is shown rather than hidden.

    python benchmarks/bench_fit.py            # CPU: mlp, tiny + small, fp32 + bf16
    python benchmarks/bench_fit.py --quick    # fewer repeats (a smoke run)

Targets: fit / torch <= 1.05 and fit / accelerate <= 1.00.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from typing import Any

import torch

from precision_nb.core.optim import OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.trainer import TrainConfig, Trainer
from precision_nb.engine.workloads import get_workload

LOG_EVERY = 10


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if out.dim() == 3:
        return torch.nn.functional.cross_entropy(
            out[:, :-1].reshape(-1, out.shape[-1]).float(), y[:, 1:].reshape(-1)
        )
    return torch.nn.functional.cross_entropy(out.float(), y)


def torch_loop(model: torch.nn.Module, batches: Any, mode: str, steps: int, start: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    dtype = torch.bfloat16 if mode == "bf16" else None
    logged = []
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = batches(start + step)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = loss_of(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % LOG_EVERY == 0:
            logged.append(loss.item())
    return time.perf_counter() - t0


def accelerate_loop(
    accelerator: Any, model: torch.nn.Module, batches: Any, steps: int, start: int
) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    model, opt = accelerator.prepare(model, opt)
    logged = []
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = batches(start + step)
        loss = loss_of(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % LOG_EVERY == 0:
            logged.append(loss.item())
    return time.perf_counter() - t0


def fit_loop(model: torch.nn.Module, batches: Any, mode: str, steps: int, info: dict) -> float:
    train = TrainConfig(steps=steps, log_every=LOG_EVERY, progress=False)
    trainer = Trainer(
        model,
        batches,
        device="cpu",
        precision=PrecisionConfig(mode=mode),
        optimizer=OptimizerConfig(lr=1e-3, weight_decay=0.01, fused=False),
        train=train,
        workload_info=info,
    )
    t0 = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - t0


def make_accelerator(mode: str) -> Any:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    return Accelerator(mixed_precision="bf16" if mode == "bf16" else "no", cpu=True)


STEPS = {"tiny": 200, "small": 30}


def bench_case(name: str, preset: str, mode: str, steps: int, repeats: int) -> dict[str, float]:
    wl = get_workload(name, preset)
    torch.manual_seed(0)
    initial = wl.make_model()
    batches = wl.make_batches("cpu")
    accelerator = make_accelerator(mode)
    variants = {
        "fit": lambda m: fit_loop(m, batches, mode, steps, wl.info),
        "torch": lambda m: torch_loop(m, batches, mode, steps, 0),
        "accelerate": lambda m: accelerate_loop(accelerator, m, batches, steps, 0),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    setup: list[float] = []
    keys = list(variants)
    for rep in range(repeats + 1):  # repeat 0 is the warm-up
        order = keys[rep % len(keys) :] + keys[: rep % len(keys)]  # rotate: no order advantage
        for key in order:
            seconds = variants[key](copy.deepcopy(initial))
            if rep > 0:
                times[key].append(seconds / steps)
        one_fit = fit_loop(copy.deepcopy(initial), batches, mode, 1, wl.info)
        one_torch = torch_loop(copy.deepcopy(initial), batches, mode, 1, 0)
        if rep > 0:
            setup.append(one_fit - one_torch)
    medians = {k: statistics.median(v) for k, v in times.items()}
    medians["setup"] = statistics.median(setup)
    # Paired ratios: variants timed within the same repeat share the machine's state, so the
    # median of per-repeat ratios cancels slow drifts of a shared, noisy machine.
    for other in ("torch", "accelerate"):
        pairs = [f / o for f, o in zip(times["fit"], times[other], strict=True)]
        medians[f"fit/{other}"] = statistics.median(pairs)
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per timed run (default: tiny 200, small 30)"
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 repeats of 20 steps")
    parser.add_argument("--workloads", default="mlp")
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--modes", default="fp32,bf16")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (1 steadies timings on a busy machine)",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = 3 if args.quick else args.repeats
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {repeats} repeats "
        f"(interleaved; ms are medians, ratios medians of paired ratios), logging every "
        f"{LOG_EVERY} steps; ms are per step, setup ms once per fit() call"
    )
    header = (
        f"{'workload':<12}{'preset':<7}{'mode':<6}{'steps':>6}{'fit ms':>9}{'torch ms':>10}"
        f"{'accel ms':>10}{'fit/torch':>11}{'fit/accel':>11}{'setup ms':>10}"
    )
    print(header)
    print("-" * len(header))
    worst_torch, worst_accel = 0.0, 0.0
    for name in args.workloads.split(","):
        for preset in args.presets.split(","):
            for mode in args.modes.split(","):
                steps = args.steps or STEPS.get(preset, 30)
                if args.quick:
                    steps = min(steps, 20)
                med = bench_case(name, preset, mode, steps, repeats)
                r_torch, r_accel = med["fit/torch"], med["fit/accelerate"]
                worst_torch, worst_accel = max(worst_torch, r_torch), max(worst_accel, r_accel)
                print(
                    f"{name:<12}{preset:<7}{mode:<6}{steps:>6}{med['fit'] * 1e3:>9.2f}"
                    f"{med['torch'] * 1e3:>10.2f}{med['accelerate'] * 1e3:>10.2f}"
                    f"{r_torch:>11.3f}{r_accel:>11.3f}{med['setup'] * 1e3:>10.2f}",
                    flush=True,
                )
    ok = worst_torch <= 1.05 and worst_accel <= 1.00
    print(
        f"worst fit/torch {worst_torch:.3f} (target <= 1.05), worst fit/accelerate "
        f"{worst_accel:.3f} (target <= 1.00): {'met' if ok else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
