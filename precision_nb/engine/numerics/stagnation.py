"""Update stagnation: how many of one optimizer step's updates a low-precision weight would lose.

An update ``u = w_new - w_old`` (fp32, what the optimizer really applied) is lost in a format when
the cast rounds it away: ``cast(cast(w_old) + u) == cast(w_old)``, i.e. ``|u|`` is less than half
the gap from the weight to its neighbour in the direction of ``u`` (at exactly half, ties to even
decide). Just above a power of two the gap below is half the gap above, so a downward update can
survive where an upward one of the same size is lost. Keeping fp32 master weights is how mixed
precision avoids this.
"""

from __future__ import annotations

import torch

from precision_nb.engine.numerics.formats import FORMATS

#: Formats whose weights the stagnation check considers.
WEIGHT_FORMATS: tuple[str, ...] = ("bf16", "fp16")


def lost_updates(old: torch.Tensor, new: torch.Tensor, name: str) -> torch.Tensor:
    """int64 device tensor ``[updated, lost]``: non-zero updates, and those lost in ``name``."""
    dtype = FORMATS[name].dtype
    update = new.detach().float() - old.float()
    moved = (update != 0) & torch.isfinite(update)
    low = old.to(dtype)
    lost = moved & ((low.float() + update).to(dtype) == low)
    return torch.stack([torch.count_nonzero(moved), torch.count_nonzero(lost)])
