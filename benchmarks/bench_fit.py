"""Step time of ``Trainer.fit()`` against a minimal hand-written torch loop and Accelerate's loop.

Same model weights, data, plan (autocast dtype) and optimizer (plain AdamW) for all three; every
loop logs the loss every 10 steps. The true plan ``bf16-true`` is measured side by side with the
mixed ``bf16``: its hand loop is pure bf16 (``model.to(torch.bfloat16)``, inputs cast, no
autocast, torch's AdamW on the bf16 parameters), Accelerate gets ``mixed_precision="no"`` and the
model cast by hand, and ``fit(precision="bf16-true")`` runs as a user gets it (``fit()`` measures
the lost updates only when asked). The mode ``bf16-true:probe`` is the same fit with
``update_stats=True``: the update probe's cost (a copy of the weights before each logged step and
two counts after it), printed beside the others and left out of the targets. Variants are
interleaved, their order rotated every repeat, each timed over a run of steps after a warm-up.

A ratio is the median of the ratios measured within each repeat (paired: the variants of one
repeat share the machine's state, so slow drifts cancel), printed with its interquartile range,
which says how much the machine moved while measuring. On a shared 2-core VM one pair can be off
by 15 % either way, so each case repeats until it has used ``--seconds`` (at least ``--repeats``
times): the median of n pairs is then good to about 1.6 IQR / sqrt(n).

What a ``fit()`` call costs once, whatever its length (seeding, the FLOP-count cache lookup,
memory probe, records), is measured on its own and printed as "setup ms": a 1-step fit minus a
1-step hand loop. And the engine's own per-step work is measured directly, where noise cannot
hide it: both loops run with the model, backward and optimizer step made nearly free (a
one-parameter model, optimizer step a no-op), so the difference is the loop machinery alone
(batch handling, output to loss, device-side records, logging).

    python benchmarks/bench_fit.py            # CPU: mlp, tiny + small, fp32, bf16, bf16-true
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


def _pure(model: torch.nn.Module, mode: str) -> torch.dtype | None:
    """The pure-bf16 loops' cast: the model to bf16 for ``bf16-true`` (None for the others)."""
    if mode != "bf16-true":
        return None
    model.to(torch.bfloat16)
    return torch.bfloat16


def torch_loop(model: torch.nn.Module, batches: Any, mode: str, steps: int, start: int) -> float:
    pure = _pure(model, mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    dtype = torch.bfloat16 if mode == "bf16" else None
    logged = []
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = batches(start + step)
        if pure is not None and x.is_floating_point():
            x = x.to(pure)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = loss_of(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % LOG_EVERY == 0:
            logged.append(loss.item())
    return time.perf_counter() - t0


def accelerate_loop(
    accelerator: Any, model: torch.nn.Module, batches: Any, steps: int, start: int, mode: str = ""
) -> float:
    pure = _pure(model, mode)  # Accelerate has no true precision: the model cast by hand
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    model, opt = accelerator.prepare(model, opt)
    logged = []
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = batches(start + step)
        if pure is not None and x.is_floating_point():
            x = x.to(pure)
        loss = loss_of(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % LOG_EVERY == 0:
            logged.append(loss.item())
    return time.perf_counter() - t0


def fit_loop(model: torch.nn.Module, batches: Any, mode: str, steps: int, info: dict) -> float:
    """``fit()``'s run of ``mode`` (``bf16-true:probe``: with the update probe)."""
    mode, _, probe = mode.partition(":")
    train = TrainConfig(steps=steps, log_every=LOG_EVERY, progress=False, update_stats=bool(probe))
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


def bench_case(
    name: str, preset: str, mode: str, steps: int, repeats: int, seconds: float
) -> dict[str, float]:
    wl = get_workload(name, preset)
    torch.manual_seed(0)
    initial = wl.make_model()
    batches = wl.make_batches("cpu")
    plain = mode.partition(":")[0]  # the hand loops of bf16-true:probe are bf16-true's
    accelerator = make_accelerator(plain)
    variants = {
        "fit": lambda m: fit_loop(m, batches, mode, steps, wl.info),
        "torch": lambda m: torch_loop(m, batches, plain, steps, 0),
        "accelerate": lambda m: accelerate_loop(accelerator, m, batches, steps, 0, plain),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    setup: list[float] = []
    keys = list(variants)
    deadline = None
    rep = 0
    while rep <= repeats or time.perf_counter() < deadline:  # repeat 0 is the warm-up
        if rep == 1:
            deadline = time.perf_counter() + seconds
        order = keys[rep % len(keys) :] + keys[: rep % len(keys)]  # rotate: no order advantage
        for key in order:
            seconds = variants[key](copy.deepcopy(initial))
            if rep > 0:
                times[key].append(seconds / steps)
        one_fit = fit_loop(copy.deepcopy(initial), batches, mode, 1, wl.info)
        one_torch = torch_loop(copy.deepcopy(initial), batches, plain, 1, 0)
        if rep > 0:
            setup.append(one_fit - one_torch)
        rep += 1
    out: dict[str, float] = {k: statistics.median(v) for k, v in times.items()}
    out["setup"] = statistics.median(setup)
    out["repeats"] = len(setup)
    for other in ("torch", "accelerate"):
        pairs = [f / o for f, o in zip(times["fit"], times[other], strict=True)]
        q1, _, q3 = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else pairs * 3
        out[f"fit/{other}"] = statistics.median(pairs)
        out[f"iqr fit/{other}"] = q3 - q1
    return out


class _Scalar(torch.nn.Module):
    """A one-parameter model: forward, loss and backward cost next to nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x


def machinery(steps: int, repeats: int) -> tuple[float, float]:
    """Seconds per step of each loop's own work (best of ``repeats``): fit(), hand loop.

    Both get the same near-free model, a batch already on the device and an optimizer whose
    step does nothing, and both log every ``LOG_EVERY`` steps as in the main benchmark.
    """
    x = torch.ones(())

    def batches(_index: int) -> tuple[torch.Tensor]:
        return (x,)

    def fit_once() -> float:
        trainer = Trainer(
            _Scalar(),
            batches,
            device="cpu",
            precision=PrecisionConfig(mode="fp32"),
            optimizer=OptimizerConfig(fused=False),
            train=TrainConfig(steps=steps, log_every=LOG_EVERY, progress=False),
        )
        trainer.optimizer.step = lambda *a, **k: None  # type: ignore[method-assign]
        t0 = time.perf_counter()
        trainer.fit()
        return (time.perf_counter() - t0) / steps

    def hand_once() -> float:
        model = _Scalar()
        opt = torch.optim.AdamW(model.parameters())
        opt.step = lambda *a, **k: None  # type: ignore[method-assign]
        logged = []
        t0 = time.perf_counter()
        for step in range(steps):
            (batch,) = batches(step)
            with torch.autocast("cpu", enabled=False):
                loss = model(batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if (step + 1) % LOG_EVERY == 0:
                logged.append(loss.item())
        return (time.perf_counter() - t0) / steps

    fit_once(), hand_once()  # warm-up
    fits, hands = [], []
    for rep in range(repeats):
        if rep % 2:
            fits.append(fit_once())
            hands.append(hand_once())
        else:
            hands.append(hand_once())
            fits.append(fit_once())
    return min(fits), min(hands)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per timed run (default: tiny 200, small 30)"
    )
    parser.add_argument("--repeats", type=int, default=15, help="at least this many per case")
    parser.add_argument(
        "--seconds", type=float, default=45.0, help="repeat each case for at least this long"
    )
    parser.add_argument("--quick", action="store_true", help="3 repeats of 20 steps")
    parser.add_argument("--workloads", default="mlp")
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--modes", default="fp32,bf16,bf16-true,bf16-true:probe")
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
    seconds = 0.0 if args.quick else args.seconds
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; loops interleaved, "
        f"logging every {LOG_EVERY} steps; ms per step (medians); ratio = median [IQR] of the "
        f"per-repeat ratios over n repeats; setup ms once per fit() call"
    )
    header = (
        f"{'workload':<9}{'preset':<7}{'mode':<16}{'steps':>6}{'n':>4}{'fit ms':>9}"
        f"{'torch ms':>10}{'accel ms':>10}{'fit/torch':>16}{'fit/accel':>16}{'setup ms':>10}"
    )
    print(header)
    print("-" * len(header))
    worst_torch, worst_accel = 0.0, 0.0
    tiny_step = None
    for name in args.workloads.split(","):
        for preset in args.presets.split(","):
            for mode in args.modes.split(","):
                steps = args.steps or STEPS.get(preset, 30)
                if args.quick:
                    steps = min(steps, 20)
                r = bench_case(name, preset, mode, steps, repeats, seconds)
                if ":" not in mode:  # the probe's row is a cost asked for, not fit()'s own
                    worst_torch = max(worst_torch, r["fit/torch"])
                    worst_accel = max(worst_accel, r["fit/accelerate"])
                if tiny_step is None or r["torch"] < tiny_step[1]:
                    tiny_step = (f"{name}/{preset} {mode}", r["torch"])

                def ratio(other: str, r: dict[str, float] = r) -> str:
                    return f"{r[f'fit/{other}']:.3f} [{r[f'iqr fit/{other}']:.2f}]"

                print(
                    f"{name:<9}{preset:<7}{mode:<16}{steps:>6}{r['repeats']:>4.0f}"
                    f"{r['fit'] * 1e3:>9.2f}{r['torch'] * 1e3:>10.2f}"
                    f"{r['accelerate'] * 1e3:>10.2f}{ratio('torch'):>16}"
                    f"{ratio('accelerate'):>16}{r['setup'] * 1e3:>10.2f}",
                    flush=True,
                )
    fit_s, hand_s = machinery(400 if args.quick else 2000, max(repeats, 9))
    extra = fit_s - hand_s
    print(
        f"\nper-step machinery (near-free model, no-op optimizer step; fastest of "
        f"{max(repeats, 9)}): "
        f"fit {fit_s * 1e6:.1f} us, hand loop {hand_s * 1e6:.1f} us -> fit adds "
        f"{extra * 1e6:.1f} us per step"
    )
    if tiny_step is not None:
        label, step_s = tiny_step
        print(
            f"that is {100 * extra / step_s:.1f} % of the shortest step measured above "
            f"({label}, {step_s * 1e3:.2f} ms)"
        )
    ok = worst_torch <= 1.05 and worst_accel <= 1.00
    print(
        f"worst fit/torch {worst_torch:.3f} (target <= 1.05), worst fit/accelerate "
        f"{worst_accel:.3f} (target <= 1.00): {'met' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
