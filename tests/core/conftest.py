"""Fixtures for the core tests: torch's hardware queries patched to pose as other machines."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Patch torch.cuda.is_available, torch.cuda.is_bf16_supported, torch.backends.mps.

    ``bf16`` is True, False or an exception instance that the BF16 query raises.
    """

    def apply(cuda: bool = False, bf16: bool | BaseException = False, mps: bool = False) -> None:
        def is_bf16_supported(including_emulation: bool = True) -> bool:
            if isinstance(bf16, BaseException):
                raise bf16
            return bool(bf16)

        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)

    return apply
