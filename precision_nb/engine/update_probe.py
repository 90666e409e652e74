"""What a run's own weights lost: updates rounded away, measured on the weights at logged steps.

Low-precision weights round an update smaller than half a unit in the last place away: the
weight is bit-identical after the step. :class:`UpdateProbe` measures it on the run itself, not as
a what-if: on a logged step it copies the trainable parameters just before ``optimizer.step()``
(an optimizer step pre-hook) and compares them with the same tensors after the step, bit for
bit, on the device, at the logging point (outside the step's measured time; a step that begins
before then has them compared first, so the counts are the logged step's). Two fractions of the
parameter elements come out, overall and per parameter tensor (layer):

- ``updates_rounded_away``: elements whose stored value did not change in that step. In a mixed
  plan these are the fp32 master weights (close to 0); in a true plan the bf16 weights. With
  stochastic rounding a single step still leaves most tiny updates at 0 (each moves the weight
  a whole unit with a probability in proportion to its size), and with Kahan summation the
  weight moves only when the compensation buffer has gathered half a unit: both keep what one
  step rounds away, which the next fraction shows.
- ``weights_never_moved``: elements still bit-identical to their value at the start of this fit
  (a copy kept on the device). An update rounded away every step leaves the weight where it
  started for good; with a remedy, or fp32 weights, it moves sooner or later.

Elements whose update is exactly 0 (a parameter that gets no gradient and no weight decay) count
as unchanged too: a mixed (fp32) run of the same model shows that floor. The device values travel
to the host at the logging point (one read per logged step, only when the probe is on:
``TrainConfig.update_stats``). Optimizer hooks run for every ``torch.optim.Optimizer``, including
the remedies' library optimizers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

#: Record keys the probe fills (None where it is off or the logged interval had no measured step).
KEYS = ("updates_rounded_away", "weights_never_moved")
NO_UPDATE_STATS: dict[str, Any] = dict.fromkeys(KEYS)


class UpdateProbe:
    """Measures rounded-away updates on logged steps of one fit; see the module docstring.

    ``steps_before``: counted steps before the fit; ``steps``: the fit's steps; ``log_every``:
    its logging interval (a logged step is a multiple of it, or the fit's last step).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        params: Sequence[torch.Tensor],
        names: Sequence[str],
        *,
        steps_before: int,
        steps: int,
        log_every: int,
    ) -> None:
        self.params, self.names = list(params), list(names)
        self.steps, self.last, self.log_every = steps_before, steps_before + steps, log_every
        self.start = [p.detach().clone() for p in self.params]
        self.numel = [p.numel() for p in self.params]
        #: The copy taken before a logged step (kept between logged steps and refilled: no new
        #: allocation, no fresh pages per logged step), and whether this step filled it.
        self._before: list[torch.Tensor] | None = None
        self._armed = False
        #: The logged step whose counts are still to be made (at the logging point: ``take``).
        self._uncounted: int | None = None
        self._pending: tuple[int, torch.Tensor] | None = None
        #: One dict per measured step: step, the two fractions and ``layers`` (name -> both).
        self.history: list[dict[str, Any]] = []
        self._handles = [
            optimizer.register_step_pre_hook(self._pre),
            optimizer.register_step_post_hook(self._post),
        ]

    def remove(self) -> None:
        """Take the hooks off the optimizer (a later fit brings its own probe)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _logged(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.last

    def _pre(self, *_: Any) -> None:
        if self._uncounted is not None:  # a logged step not yet read: count it before it moves
            self._count()
        if not self._logged(self.steps + 1):
            return
        if self._before is None:
            self._before = [p.detach().clone() for p in self.params]
        else:
            with torch.no_grad():
                for b, p in zip(self._before, self.params, strict=True):
                    b.copy_(p.detach())
        self._armed = True

    def _post(self, *_: Any) -> None:
        self.steps += 1
        if not self._armed or self._before is None:  # not a logged step (runs every step)
            return
        self._armed = False
        # counted at the logging point, after the step's time is taken: the counts read every
        # parameter twice, which a measured step of a true plan should not carry
        self._uncounted = self.steps

    def _count(self) -> None:
        step, before, self._uncounted = self._uncounted, self._before, None
        if step is None or before is None:
            return
        moved, left = [], []
        with torch.no_grad():  # the copy taken before the step is the scratch of both counts
            for p, b, s in zip(self.params, before, self.start, strict=True):
                moved.append(_moved(p, b, scratch=b))
                left.append(_moved(p, s, scratch=b))
        self._pending = (step, torch.stack(moved + left))  # stays on the device

    def take(self) -> dict[str, Any]:
        """The record fields of the last measured step (a host read), then forget it."""
        if self._uncounted is not None:
            self._count()
        if self._pending is None:
            return dict(NO_UPDATE_STATS)
        step, counts = self._pending
        self._pending = None
        values = counts.tolist()  # the logging point's read
        n = len(self.params)
        total = sum(self.numel) or 1
        same = [k - m for k, m in zip(self.numel, values[:n], strict=True)]
        still = [k - m for k, m in zip(self.numel, values[n:], strict=True)]
        layers = {
            name: {"updates_rounded_away": s / k, "weights_never_moved": t / k}
            for name, s, t, k in zip(self.names, same, still, self.numel, strict=True)
            if k
        }
        out = {"updates_rounded_away": sum(same) / total, "weights_never_moved": sum(still) / total}
        self.history.append({"step": step, **out, "layers": layers})
        return out


#: An integer dtype of each element size: a tensor viewed as one compares bit patterns.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _moved(
    now: torch.Tensor, before: torch.Tensor, scratch: torch.Tensor | None = None
) -> torch.Tensor:
    """How many elements of ``now`` differ from ``before`` bit for bit (a device scalar): the
    difference of the bit patterns is not zero exactly there. Several times faster than
    ``(now == before).sum()`` on a CPU, and bit-identical is what a rounded-away update leaves.
    ``scratch`` (a tensor like ``now``, ``before`` itself allowed) takes the difference instead
    of a new tensor: no allocation, no fresh pages to fault in."""
    if hasattr(now, "to_local"):  # FSDP2's DTensor: this rank's shard
        now, before = now.to_local(), before.to_local()
        scratch = None if scratch is None else scratch.to_local()
    bits = _BITS.get(now.element_size())
    if bits is None:  # no integer type of that size (complex128): compare values
        return torch.count_nonzero(now != before)
    out = None if scratch is None else scratch.view(bits)
    return torch.count_nonzero(torch.sub(now.view(bits), before.view(bits), out=out))
