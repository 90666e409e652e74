"""Does the time split add up, does it explain the measured speedup, and what does it cost?

Each run is its own process (a fresh interpreter: its own memory layout and kernel choices) that
profiles fp32 against bf16 with the time split, on two models:

- ``mlp-small``: the default workload and preset, by a default profile (fresh processes until the
  speedup interval reaches its target or the budget is spent, inspection and numerics on);
- ``gpt2``: Hugging Face GPT-2 built from a small config (random weights, nothing downloaded),
  called with a dict batch and its own loss: a model object, which a profile sends to its fresh
  processes by value, as it would a user's. Those processes import ``transformers`` to load it;
  the test extras' set-up that lets it import beside a CPU build of torch
  (``tests/thirdparty_setup.py``) reaches them through a ``sitecustomize`` on their
  ``PYTHONPATH``.

Printed per run: the profiled step, the families' sum against the step timer's median for the
same steps (target within 5 %), the profiler's cost against the timed rounds' median, the
reconstructed speedup against the calibrated one with its interval (target: inside the interval
in at least 4 of 5 runs), the processes the split was pooled over with the range of their single
reconstructions (or, not pooled, the timed speedup of the process the split ran in with its
interval over its rounds), whether the product's own check agreed (the calibrated interval, or
that process's when not pooled, widened by the stated tolerance), and the split's cost (every
process's profiled steps) against the rest of the profile's wall time (target at most 15 % for
the default profile).

    python benchmarks/bench_time_split.py                  # 5 runs per model
    python benchmarks/bench_time_split.py --runs 1 --quick # a smoke run (tiny preset, few steps)

A shared machine moves these numbers; read them with its load in mind.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
CASES = ("mlp-small", "gpt2")


def gpt2(quick: bool) -> tuple[torch.nn.Module, list[dict[str, torch.Tensor]]]:
    """GPT-2 from a config, and its batches (input ids, attention mask, labels)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import thirdparty_setup  # noqa: F401  (lets transformers import beside a CPU build of torch)
    import transformers

    transformers.logging.set_verbosity_error()
    width, seq = (64, 16) if quick else (128, 64)
    config = transformers.GPT2Config(
        n_embd=width, n_layer=2, n_head=4, vocab_size=1000, n_positions=128, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    batches = []
    for _ in range(4):
        ids = torch.randint(0, 1000, (8, seq))
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return model, batches


def run_case(case: str, quick: bool = False) -> dict[str, Any]:
    """One profile of fp32 against bf16 with the time split; the figures this benchmark prints."""
    from precision_nb import profile

    options: dict[str, Any] = {"compare": ("fp32", "bf16"), "progress": False}
    if quick:
        options.update(steps=4, rounds=2, processes=1, inspect=False, numerics=False)
    if case == "mlp-small":
        target: dict[str, Any] = {"model": "mlp", "preset": "tiny" if quick else "small"}
    elif case == "gpt2":
        model, batches = gpt2(quick)
        target = {"model": model, "batches": batches}
    else:
        raise ValueError(f"case: invalid value {case!r}; allowed: {', '.join(CASES)}")
    t0 = time.perf_counter()
    prof = profile(**target, **options)
    wall = time.perf_counter() - t0
    analysis = prof.time_split
    out: dict[str, Any] = {"case": case, "wall_s": wall, "split_s": analysis.seconds}
    for label, split in analysis.splits.items():
        out[label] = {
            "missing": split.missing,
            "step_ms": split.step_s * 1e3,
            "sum_error": split.sum_error,
            "overhead": split.overhead,
            "unprofiled_ms": (split.unprofiled_s or 0.0) * 1e3,
            "measured_ms": (split.measured_s or 0.0) * 1e3,
            "events": split.events,
            "processes": split.processes,
            "traced_ms": split.traced_s * 1e3,
            "family_events": dict(split.family_events),
            "traced": {k: v * 1e3 for k, v in split.traced.items()},
        }
    diff = analysis.differences.get("bf16")
    if diff is not None:
        out["diff"] = {
            "reconstructed": diff.reconstructed, "calibrated": diff.calibrated, "low": diff.low,
            "high": diff.high, "agrees": diff.agrees, "tolerance": diff.tolerance,
            "sentence": diff.sentence, "missing": diff.missing, "process": diff.process,
            "process_low": diff.process_low, "process_high": diff.process_high,
            "by_process": list(diff.by_process),
        }  # fmt: skip
    return out


def _inside(diff: dict[str, Any]) -> bool | None:
    got, low, high = diff.get("reconstructed"), diff.get("low"), diff.get("high")
    if got is None or low is None or high is None:
        return None
    return low <= got <= high


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The printed table: one line per run, then the targets per model."""
    head = (
        f"{'case':10} {'run':>3} {'fp32 ms':>8} {'bf16 ms':>8} {'sum err':>8} {'overhead':>9} "
        f"{'reconstr.':>9} {'calibrated [interval]':>24} {'in CI':>6} "
        f"{'process(es)':>24} {'agrees':>7} {'split s':>8} {'cost':>6}"
    )
    lines = [head]
    for i, r in enumerate(rows):
        d = r.get("diff") or {}
        fp32, bf16 = r.get("fp32", {}), r.get("bf16", {})
        errors = [abs(x["sum_error"]) for x in (fp32, bf16) if x.get("sum_error") is not None]
        over = [x["overhead"] for x in (fp32, bf16) if x.get("overhead") is not None]
        cal = (
            f"{d['calibrated']:.3f} [{d['low']:.3f}, {d['high']:.3f}]"
            if d.get("low") is not None
            else str(d.get("calibrated"))
        )
        single = d.get("by_process") or []
        own = (
            f"{d['process']:.3f} [{d['process_low']:.3f}, {d['process_high']:.3f}]"
            if d.get("process_low") is not None
            else f"{len(single)}: {min(single):.2f}-{max(single):.2f}"
            if single
            else "(one process)"
        )
        rest = r["wall_s"] - r["split_s"]
        lines.append(
            f"{r['case']:10} {i:>3} {fp32.get('step_ms', 0):8.2f} {bf16.get('step_ms', 0):8.2f} "
            f"{max(errors, default=float('nan')):8.1%} "
            f"{'/'.join(f'{o:+.0%}' for o in over):>9} "
            f"{d.get('reconstructed') or float('nan'):9.3f} {cal:>24} {str(_inside(d)):>6} "
            f"{own:>24} {str(d.get('agrees')):>7} {r['split_s']:8.1f} {r['split_s'] / rest:6.1%}"
        )
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        inside = sum(1 for r in mine if _inside(r.get("diff") or {}))
        agree = sum(1 for r in mine if (r.get("diff") or {}).get("agrees"))
        sums = [
            abs(r[k]["sum_error"]) <= 0.05
            for r in mine
            for k in ("fp32", "bf16")
            if r.get(k, {}).get("sum_error") is not None
        ]
        costs = [r["split_s"] / (r["wall_s"] - r["split_s"]) for r in mine]
        lines.append(
            f"{case}: families within 5 % of the step timer in {sum(sums)} of {len(sums)} splits; "
            f"reconstructed speedup inside the calibrated interval in {inside} of {len(mine)} runs "
            f"(target >= 4 of 5); the product's check (inside the calibrated interval, or the "
            f"split's own process's when it is not pooled, widened by the tolerance) in {agree} of "
            f"{len(mine)}; split cost "
            f"{min(costs):.1%}-{max(costs):.1%} of the rest of the profile (target <= 15 % for "
            "the default profile)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny preset, few steps")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--save", help="write every run's figures to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(run_case(args.worker, args.quick)), flush=True)
        return 0
    rows = []
    sys.path.insert(0, str(ROOT / "tests"))
    from thirdparty_setup import site_folder

    env = dict(os.environ)  # the runs and their measuring processes import transformers
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site_folder(), env.get("PYTHONPATH")) if p)
    for case in args.cases.split(","):
        for _ in range(args.runs):
            cmd = [sys.executable, __file__, "--worker", case] + (["--quick"] if args.quick else [])
            done = subprocess.run(
                cmd, capture_output=True, text=True, check=False, cwd=ROOT, env=env
            )
            found = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
            if done.returncode != 0 or not found:
                print(f"{case}: the worker failed ({done.returncode}):\n{done.stderr[-2000:]}")
                return 1
            rows.append(json.loads(found[-1][len("RESULT ") :]))
            print(f"{case}: {rows[-1].get('diff', {}).get('sentence')}", flush=True)
    print("\n".join(table(rows)))
    if args.save:
        Path(args.save).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
