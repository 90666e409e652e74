"""Built-in workloads: an MLP classifier, a small causal transformer LM and a conv net, by preset.

``get_workload(name, preset)`` returns a :class:`Workload`: a model factory, a batch factory that
places a fixed pool of batches on the training device once (so data loading never shows up in step
times), and an ``info`` dict (name, preset, batch size, dims). Data are deterministic for a seed:
synthetic tasks come from a fixed random teacher, the language model reads the shipped corpus
(character level) or synthetic tokens.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# The presets, and the workload ``precision-nb profile`` uses when none is named: the one list
# of defaults, read by the command line before torch loads (re-exported here for the engine).
from precision_nb.core.defaults import DEFAULT_PRESET as DEFAULT_PRESET
from precision_nb.core.defaults import DEFAULT_WORKLOAD
from precision_nb.core.defaults import PRESET_NAMES as PRESETS
from precision_nb.core.validate import short_repr

_POOL_BATCHES = 8  # distinct batches per workload; step i uses batch i % pool


@dataclass(frozen=True)
class Workload:
    """A ready-to-train task: ``make_model()``, ``make_batches(device)`` -> step -> batch."""

    name: str
    preset: str
    make_model: Callable[[], nn.Module]
    make_batches: Callable[[torch.device | str], Callable[[int], Any]]
    info: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------- models


class MLP(nn.Module):
    """A plain ReLU MLP classifier."""

    def __init__(self, in_dim: int, hidden: int, depth: int, classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Block(nn.Module):
    """Pre-norm transformer block with causal ``scaled_dot_product_attention``."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A small causal transformer language model returning logits (batch, time, vocab)."""

    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        return self.head(self.ln(self.blocks(x)))


class ConvNet(nn.Module):
    """Conv -> BatchNorm -> ReLU stages with stride-2 downsampling, then a linear classifier."""

    def __init__(self, channels: tuple[int, ...], classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for c_out in channels:
            layers += [
                nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(c_out),
                nn.ReLU(),
            ]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


# ----------------------------------------------------------------------------------- presets

_MLP = {
    "tiny": dict(in_dim=64, hidden=128, depth=2, classes=10, batch_size=32),
    "small": dict(in_dim=256, hidden=768, depth=3, classes=16, batch_size=64),
    "medium": dict(in_dim=1024, hidden=4096, depth=4, classes=64, batch_size=512),
    "large": dict(in_dim=2048, hidden=8192, depth=4, classes=128, batch_size=1024),
}
_LM = {
    "tiny": dict(d_model=64, heads=4, layers=2, seq_len=64, batch_size=8),
    "small": dict(d_model=192, heads=6, layers=4, seq_len=128, batch_size=16),
    "medium": dict(d_model=512, heads=8, layers=8, seq_len=256, batch_size=32),
    "large": dict(d_model=1024, heads=16, layers=12, seq_len=512, batch_size=32),
}
_CNN = {
    "tiny": dict(image=16, channels=(16, 32), classes=10, batch_size=16),
    "small": dict(image=32, channels=(32, 64, 128), classes=10, batch_size=64),
    "medium": dict(image=64, channels=(64, 128, 256, 512), classes=100, batch_size=128),
    "large": dict(image=128, channels=(64, 128, 256, 512, 1024), classes=1000, batch_size=128),
}
_SYNTHETIC_VOCAB = 512
_ALIASES = {"lm": "transformer"}
WORKLOADS: dict[str, str] = {
    "mlp": "MLP classifier on synthetic data from a fixed random teacher",
    "transformer": "causal transformer LM (scaled_dot_product_attention); alias 'lm'; "
    "data='corpus' (shipped text, char level) or data='synthetic'",
    "cnn": "conv net (Conv2d + BatchNorm) classifying synthetic images",
}


def load_corpus() -> str:
    """The short text shipped with the package (original prose about numbers and precision)."""
    return resources.files("precision_nb.engine").joinpath("data/corpus.txt").read_text("utf-8")


def _pool(
    device: torch.device | str, build: Callable[[torch.Generator], Any], seed: int
) -> Callable[[int], Any]:
    gen = torch.Generator().manual_seed(seed)
    moved = [tuple(t.to(device) for t in build(gen)) for _ in range(_POOL_BATCHES)]

    def batch(step: int) -> Any:
        return moved[step % len(moved)]

    return batch


#: What a builder returns from a preset's dims and the seed: the model factory, the function
#: that makes one batch from a generator (pooled by ``_pool``) and the workload's ``info``.
_Built = tuple[Callable[[], nn.Module], Callable[[torch.Generator], Any], dict[str, Any]]


def _mlp(p: dict[str, Any], seed: int) -> _Built:
    in_dim, classes, bs = p["in_dim"], p["classes"], p["batch_size"]
    teacher = torch.randn(in_dim, classes, generator=torch.Generator().manual_seed(seed + 1))

    def build(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(bs, in_dim, generator=gen)
        return x, (x @ teacher).argmax(dim=1)

    model = functools.partial(MLP, in_dim, p["hidden"], p["depth"], classes)
    return model, build, dict(task="classification", dims=dict(p))


def _lm(p: dict[str, Any], seed: int, data: str) -> _Built:
    if data not in ("corpus", "synthetic"):
        raise ValueError(
            f"data={short_repr(data)} is not a transformer data source; allowed: corpus, synthetic"
        )
    t, bs = p["seq_len"], p["batch_size"]
    if data == "corpus":
        text = load_corpus()
        chars = sorted(set(text))
        vocab = len(chars)
        lookup = {c: i for i, c in enumerate(chars)}
        ids = torch.tensor([lookup[c] for c in text], dtype=torch.long)
        if ids.numel() <= t + 1:  # pragma: no cover - corpus is a few KB, sequences are shorter
            ids = ids.repeat(math.ceil((t + 2) / ids.numel()))

        def build(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            starts = torch.randint(0, ids.numel() - t, (bs,), generator=gen)
            x = torch.stack([ids[s : s + t] for s in starts.tolist()])
            return x, x

    else:
        vocab = _SYNTHETIC_VOCAB

        # a repeating pattern per sequence, so a causal model can learn to continue it
        def build(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            period = torch.randint(2, 9, (bs, 1), generator=gen)
            base = torch.randint(0, vocab, (bs, 8), generator=gen)
            pos = torch.arange(t).unsqueeze(0) % period
            x = base.gather(1, pos)
            return x, x

    model = functools.partial(TinyGPT, vocab, p["d_model"], p["heads"], p["layers"], t)
    dims = dict(p, vocab=vocab, data=data)
    return model, build, dict(task="causal_lm", dims=dims, tokens_per_batch=bs * t)


def _cnn(p: dict[str, Any], seed: int) -> _Built:
    size, classes, bs = p["image"], p["classes"], p["batch_size"]
    protos = torch.randn(classes, 3, size, size, generator=torch.Generator().manual_seed(seed + 1))

    def build(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, classes, (bs,), generator=gen)
        x = protos[y] + 0.5 * torch.randn(bs, 3, size, size, generator=gen)
        return x, y

    model = functools.partial(ConvNet, tuple(p["channels"]), classes)
    return model, build, dict(task="classification", dims=dict(p, channels=list(p["channels"])))


def get_workload(
    name: str = DEFAULT_WORKLOAD, preset: str = "tiny", *, seed: int = 0, data: str = "corpus"
) -> Workload:
    """Return the built-in workload ``name`` at size ``preset``.

    ``name``: one of :data:`WORKLOADS` (``"lm"`` is an alias of ``"transformer"``); ``preset``: one
    of :data:`PRESETS`; ``data`` selects the transformer's data (``"corpus"`` or ``"synthetic"``).
    Raises ``ValueError`` listing the known names for anything else.
    """
    key = _ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if key not in WORKLOADS:
        known = ", ".join([*WORKLOADS, *_ALIASES])
        raise ValueError(f"workload={short_repr(name)} is not a built-in workload; known: {known}")
    size = str(preset).strip().lower()
    if size not in PRESETS:
        raise ValueError(
            f"preset={short_repr(preset)} is not a known size preset; known: {', '.join(PRESETS)}"
        )
    if key == "mlp":
        model, build, info = _mlp(_MLP[size], seed)
    elif key == "cnn":
        model, build, info = _cnn(_CNN[size], seed)
    else:
        model, build, info = _lm(_LM[size], seed, data)
    info = dict(info, name=key, preset=size, batch_size=info["dims"]["batch_size"])
    return Workload(key, size, model, lambda device: _pool(device, build, seed), info)
