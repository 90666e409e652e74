"""Update stagnation: how many of one optimizer step's updates a low-precision weight would lose.

An update ``u = w_new - w_old`` (fp32, what the optimizer really applied) is lost in a format when
rounding the updated low-precision weight gives the old one back: ``cast(cast(w_old) + u) ==
cast(w_old)``, i.e. ``|u|`` is below half an ulp of the weight in that format (at exactly half, the
cast's ties-to-even decide). Keeping fp32 master weights is how mixed precision avoids this.
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
