"""How busy the machine was while something was measured: load average and others' CPU time.

:func:`sample` reads the machine's load with psutil (this process's CPU time includes its finished
children: the fresh measuring processes); :class:`Load` compares two samples. A measurement with
others' share of at least :data:`BUSY_SHARE` (or :data:`STEAL_SHARE` stolen) was taken on a busy
machine: its figures include their interference, and :meth:`Load.note` says so, to be shown
before any figure.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

from precision_nb.core.events import Event

__all__ = ["BUSY_SHARE", "STEAL_SHARE", "Load", "LoadSample", "sample"]

#: Others' share of the machine's CPU time at or above which the machine counts as busy.
BUSY_SHARE = 0.10
#: The share of CPU time stolen by a hypervisor at or above which the machine counts as busy.
STEAL_SHARE = 0.05


@dataclass(frozen=True)
class LoadSample:
    """One reading: wall clock, load averages (1, 5, 15 min; None where the OS has none), CPUs,
    the machine's busy and stolen CPU seconds, and this process's (with finished children)."""

    wall: float
    load_average: tuple[float, float, float] | None
    cpus: int
    busy_s: float
    steal_s: float
    own_s: float


def sample() -> LoadSample:
    """Read the machine's load now (psutil)."""
    times = psutil.cpu_times()
    idle = getattr(times, "idle", 0.0) + getattr(times, "iowait", 0.0)
    steal = getattr(times, "steal", 0.0)
    guest = getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    busy = sum(times) - idle - steal - guest  # guest time is counted in user time already
    own = psutil.Process().cpu_times()
    own_s = own.user + own.system + own.children_user + own.children_system
    try:
        average: tuple[float, float, float] | None = tuple(psutil.getloadavg())  # type: ignore[assignment]
    except (AttributeError, OSError):
        average = None
    return LoadSample(
        time.monotonic(), average, psutil.cpu_count() or os.cpu_count() or 1, busy, steal, own_s
    )


@dataclass(frozen=True)
class Load:
    """The machine's load between two samples (the start and the end of a measurement)."""

    start: LoadSample
    end: LoadSample

    @property
    def seconds(self) -> float:
        return max(self.end.wall - self.start.wall, 1e-9)

    @property
    def capacity_s(self) -> float:
        """The machine's CPU seconds over the interval (wall time x CPUs)."""
        return self.seconds * self.start.cpus

    @property
    def others_share(self) -> float:
        """The share of the machine's CPU time used by other processes (0..1)."""
        others = (self.end.busy_s - self.start.busy_s) - (self.end.own_s - self.start.own_s)
        return min(1.0, max(0.0, others / self.capacity_s))

    @property
    def steal_share(self) -> float:
        """The share of the machine's CPU time stolen by a hypervisor (0..1)."""
        return min(1.0, max(0.0, (self.end.steal_s - self.start.steal_s) / self.capacity_s))

    @property
    def busy(self) -> bool:
        return self.others_share >= BUSY_SHARE or self.steal_share >= STEAL_SHARE

    def _averages(self) -> str:
        a, b = self.start.load_average, self.end.load_average
        if a is None or b is None:
            return "load average not available here"
        return f"load average {a[0]:.1f} at the start, {b[0]:.1f} at the end"

    def describe(self) -> str:
        """Always: the shares and load averages, e.g. for the report's settings."""
        return (
            f"other processes used {self.others_share:.0%} of the machine's CPU time over "
            f"{self.seconds:.1f} s ({self.start.cpus} CPUs; {self._averages()}); "
            f"{self.steal_share:.0%} stolen by a hypervisor"
        )

    def note(self) -> str:
        """On a busy machine, the sentence to show before any figure; "" on a quiet one."""
        if not self.busy:
            return ""
        return (
            f"The machine was busy while this was measured: {self.describe()}. Every figure "
            "includes that interference; the intervals cover the variation it caused during this "
            "measurement, not what a quiet machine would give."
        )

    def event(self) -> Event:
        """The load as an event: a warning with :meth:`note` when busy, else its description."""
        kind = "warning" if self.busy else "measurement"
        return Event(
            kind, self.note() or f"machine load: {self.describe()}", {"load": self.to_dict()}
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "others_share": self.others_share,
            "steal_share": self.steal_share,
            "busy": self.busy,
            "seconds": self.seconds,
            "cpus": self.start.cpus,
            "load_average_start": self.start.load_average,
            "load_average_end": self.end.load_average,
        }
