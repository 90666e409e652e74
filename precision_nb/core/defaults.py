"""What a profile measures when nothing else is asked: the one list of defaults, without torch.

``profile()``, the command line (which reads these before torch loads), the engine's workloads
and the panel take their defaults from here, so no copy has to be kept equal to another.
"""

from __future__ import annotations

#: The built-in workload names (``lm`` is the transformer's alias) and their size presets.
WORKLOAD_NAMES: tuple[str, ...] = ("mlp", "transformer", "lm", "cnn")
PRESET_NAMES: tuple[str, ...] = ("tiny", "small", "medium", "large")
#: The workload a profile uses when none is named: large enough that matmuls dominate the step
#: on 2 CPU cores, small enough that fp32 + bf16 finish well under a minute.
DEFAULT_WORKLOAD = "mlp"
DEFAULT_PRESET = "small"
#: The precision requests a profile compares when none are named.
DEFAULT_COMPARE: tuple[str, ...] = ("fp32", "bf16", "fp16")
#: Measured optimizer steps per plan when ``profile`` is not given ``steps`` ...
DEFAULT_STEPS = 48
#: ... split over this many interleaved rounds (``rounds``) in each process; warm-up on top.
DEFAULT_ROUNDS = 8
#: Processes measuring the plans (``processes``): None adds fresh ones until the target or the
#: budget; 1 measures in this process only.
DEFAULT_PROCESSES: int | None = None
#: The relative half-width every speedup interval should reach (``target``; 0.05 = ±5 %) ...
DEFAULT_TARGET = 0.05


class DefaultBudget(float):
    """A number of seconds that knows it is the default budget, not one asked for: with
    ``processes=N`` the default limits only the processes a target adds, while a budget asked
    for, 40 s included, stops the N early. Told apart by identity (``is DEFAULT_BUDGET_S``);
    it reads and computes as the float it is."""

    def __repr__(self) -> str:
        return repr(float(self))

    def __str__(self) -> str:
        return f"{float(self):g}"


#: ... within this many seconds of measurement (``budget_s``: warm-ups, rounds, processes).
DEFAULT_BUDGET_S: float = DefaultBudget(40.0)
#: How the host allocator is set in measuring processes (:mod:`precision_nb.engine.allocator`).
ALLOCATOR_POLICIES = ("settled", "as-is")
DEFAULT_ALLOCATOR = "settled"
#: Warm-up cap in steps per plan (the warm-up usually ends earlier, when step times settle).
DEFAULT_WARMUP_MAX = 15
#: About this many logged points per plan in a profile.
PROFILE_POINTS = 25
#: The confidence of every interval shown, the rounds one process needs for one, and the
#: processes a target-driven interval starts looking at: the statistics module
#: (:mod:`precision_nb.engine.stats`) reads them from here.
CONFIDENCE = 0.95
MIN_ROUNDS = 6
#: The most processes one measurement starts (a target that cannot be reached stops here).
MAX_PROCESSES = 40
MIN_PROCESSES = 3
