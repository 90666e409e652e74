"""Are processes forked from one parent independent samples of a speedup? Why the measuring
processes are each started from scratch.

The default workload's hand-written interleaved loop (``bench_profile.hand_loop``, bf16 over
fp32, the profile's rounds and blocks) runs in processes started two ways, in a shuffled order:

- ``--exec N`` interpreters started from scratch (each imports torch);
- ``--parents P`` interpreters that import torch, then each fork ``--children K`` children one
  after the other (each child runs the loop once).

If a forked child were a fresh process's sample, the children of one parent would spread as
much as interpreters started from scratch, and the parents' means would agree within the
children's spread. Printed: each value; the standard deviation of the exec'd processes; each
parent's children with their mean and standard deviation; the pooled within-parent standard
deviation; and the one-way analysis of variance of the children by parent (``scipy.stats.
f_oneway``): a small p-value says the parent, fixed when it started, sets part of the speedup.

    python benchmarks/bench_process_start.py                      # 8 exec'd, 4 parents x 4
    python benchmarks/bench_process_start.py --exec 4 --parents 2 --children 3   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

from scipy import stats as sps

from precision_nb.core.defaults import DEFAULT_ROUNDS, DEFAULT_STEPS

HERE = Path(__file__).resolve().parent
BLOCK = max(1, DEFAULT_STEPS // DEFAULT_ROUNDS)
LOOP = f"bench_profile.hand_loop(('fp32', 'bf16'), {DEFAULT_ROUNDS}, {BLOCK})['bf16']"


def exec_once() -> float:
    """The hand loop's speedup in an interpreter started from scratch (the calibration
    benchmark's hand process; imported here, beside this script, when it runs)."""
    from bench_calibration import hand_process

    return hand_process(DEFAULT_ROUNDS, BLOCK)


def parent_once(children: int) -> list[float]:
    """The speedups of ``children`` children forked one after the other from an interpreter that
    imported torch (and the loop's modules) first."""
    code = f"""
import json, os, sys
sys.path.insert(0, {str(HERE)!r})
import torch, bench_profile
out = []
for _ in range({children}):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, repr({LOOP}).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 100):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    out.append(float(data))
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exec", type=int, default=8, dest="execs", help="exec'd processes")
    parser.add_argument("--parents", type=int, default=4, help="parents that fork")
    parser.add_argument("--children", type=int, default=4, help="children per parent")
    parser.add_argument("--seed", type=int, default=1, help="the order's shuffle")
    args = parser.parse_args(argv)
    if args.execs < 2 or args.parents < 2 or args.children < 2:
        parser.error("--exec, --parents and --children: each at least 2")
    order = ["exec"] * args.execs + ["parent"] * args.parents
    random.Random(args.seed).shuffle(order)
    execs: list[float] = []
    parents: list[list[float]] = []
    for what in order:
        if what == "exec":
            execs.append(exec_once())
            print(f"exec'd process: {execs[-1]:.3f}x", flush=True)
        else:
            parents.append(parent_once(args.children))
            values = ", ".join(f"{v:.3f}" for v in parents[-1])
            print(f"parent {len(parents)}: {values}", flush=True)
    print(f"{len(execs)} exec'd processes: sd {statistics.stdev(execs):.3f}, "
          f"{min(execs):.2f}-{max(execs):.2f}x, mean {statistics.mean(execs):.3f}")  # fmt: skip
    for k, values in enumerate(parents, 1):
        print(f"parent {k}: mean {statistics.mean(values):.3f}, sd {statistics.stdev(values):.3f}")
    within = statistics.mean(statistics.variance(v) for v in parents) ** 0.5
    means = [statistics.mean(v) for v in parents]
    test = sps.f_oneway(*parents)
    print(
        f"children of one parent: pooled sd {within:.3f}; parents' means "
        f"{min(means):.2f}-{max(means):.2f}x (sd {statistics.stdev(means):.3f}); one-way ANOVA "
        f"by parent F = {test.statistic:.2f}, p = {test.pvalue:.3g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
