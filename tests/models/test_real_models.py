"""Hugging Face GPT-2 (dict batches, -100 padding) and BERT (classification, regression),
torchvision's resnet18 and an ``nn.TransformerEncoderLayer`` (SDPA) model, each through inspect,
fit, compare, profile and numerics, with every byte of the inspection checked by hand arithmetic
from the model's configuration."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import precision_nb as pnb
from precision_nb.engine.inspect import memory as mem
from precision_nb.engine.measure import MeasureConfig

FAST = MeasureConfig(rounds=1, warmup_min=1, warmup_max=1)
FIT = {"progress": False, "measure_peak": False}


@dataclass(frozen=True)
class Case:
    """A model, its batches and what hand arithmetic from its configuration says about it."""

    build: Callable[[], nn.Module]
    batches: list[Any]
    params: int  # parameters
    tensors: int  # parameter tensors (AdamW keeps one fp32 step counter per tensor)
    copies: int  # bf16 bytes of autocast's weight copies: the weights of the ops it casts
    tokens: int | None  # token positions per sample (padding included), None: no token ids
    reference_loss: Callable[[nn.Module, Any], torch.Tensor]


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _hf_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def _ce_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


# --------------------------------------------------------------------------------------- GPT-2
E, LAYERS, VOCAB, POSITIONS, T = 64, 2, 1000, 64, 16


def _gpt2(transformers: Any) -> Case:
    config = transformers.GPT2Config(
        n_embd=E, n_layer=LAYERS, n_head=2, vocab_size=VOCAB, n_positions=POSITIONS,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip

    def build() -> nn.Module:
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(config)

    ids = torch.randint(0, VOCAB, (4, T), generator=_gen())
    mask = torch.ones_like(ids)
    mask[:, 12:] = 0  # the last 4 positions are padding: labels -100, as HF's collators write
    labels = ids.masked_fill(mask == 0, -100)
    # per block: Conv1D c_attn (E x 3E + 3E), attn c_proj (E x E + E), mlp c_fc (E x 4E + 4E),
    # mlp c_proj (4E x E + E): Conv1D calls addmm, which autocast casts; two LayerNorms
    block = (3 * E * E + 3 * E) + (E * E + E) + (4 * E * E + 4 * E) + (4 * E * E + E)
    return Case(
        build,
        [{"input_ids": ids, "attention_mask": mask, "labels": labels}],
        params=VOCAB * E + POSITIONS * E + LAYERS * (block + 2 * 2 * E) + 2 * E,
        tensors=2 + LAYERS * 12 + 2,
        copies=2 * (LAYERS * block + VOCAB * E),  # lm_head is tied to wte: one copy of it
        tokens=T,
        reference_loss=_hf_loss,
    )


# ---------------------------------------------------------------------------------------- BERT
H, INTER = 64, 128


def _bert(transformers: Any, labels: int) -> Case:
    config = transformers.BertConfig(
        hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=2, intermediate_size=INTER,
        vocab_size=VOCAB, max_position_embeddings=POSITIONS, num_labels=labels,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip

    def build() -> nn.Module:
        torch.manual_seed(0)
        return transformers.BertForSequenceClassification(config)

    ids = torch.randint(0, VOCAB, (4, T), generator=_gen())
    target = torch.tensor([0, 2, 1, 0]) if labels > 1 else torch.tensor([0.5, -1.0, 2.0, 0.0])
    # per layer: query, key, value, attention output (H x H + H each), intermediate and output
    # dense; pooler dense; classifier (H x labels + labels): all Linear, all cast
    linears = 4 * (H * H + H) + (H * INTER + INTER) + (INTER * H + H)
    head = (H * H + H) + (H * labels + labels)
    embeddings = VOCAB * H + POSITIONS * H + 2 * H + 2 * H  # word, position, type, LayerNorm
    return Case(
        build,
        [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": target}],
        params=embeddings + LAYERS * (linears + 2 * 2 * H) + head,
        tensors=5 + LAYERS * 16 + 4,
        copies=2 * (LAYERS * linears + head),
        tokens=T,
        reference_loss=_hf_loss,
    )


# ------------------------------------------------------------------------------------ resnet18
def _resnet18(torchvision: Any) -> Case:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return torchvision.models.resnet18(num_classes=10)

    convs, norms, c_in = 3 * 64 * 7 * 7, 2 * 64, 64  # stem conv 7x7 and its BatchNorm
    for width in (64, 128, 256, 512):  # two BasicBlocks per stage, 3x3 convs
        convs += c_in * width * 9 + 3 * width * width * 9
        norms += 4 * 2 * width
        if width != c_in:  # the first block of a widening stage downsamples with a 1x1 conv + BN
            convs += c_in * width
            norms += 2 * width
        c_in = width
    fc = 512 * 10 + 10
    images = torch.randn(2, 3, 32, 32, generator=_gen())
    return Case(
        build,
        [(images, torch.tensor([3, 7]))],
        params=convs + norms + fc,
        tensors=20 + 2 * 20 + 2,  # 20 convs (no bias), 20 BatchNorms (weight, bias), fc
        copies=2 * (convs + fc),  # conv weights and fc; BatchNorm stays fp32
        tokens=None,
        reference_loss=_ce_loss,
    )


# --------------------------------------------------------------------- TransformerEncoderLayer
D, FF, TOKENS = 32, 64, 50


class Encoder(nn.Module):
    """Embedding, one ``nn.TransformerEncoderLayer`` (its attention runs SDPA), a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(TOKENS, D)
        self.enc = nn.TransformerEncoderLayer(D, 4, FF, dropout=0.0, batch_first=True)
        self.head = nn.Linear(D, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(x)).mean(dim=1))


def _encoder() -> Case:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return Encoder()

    # MultiheadAttention: in_proj_weight (3D x D) + in_proj_bias, out_proj (D x D + D); the MLP
    # linear1 (D x FF + FF), linear2 (FF x D + D); the head (D x 3 + 3). Norms and embedding: fp32
    cast = (3 * D * D + 3 * D) + (D * D + D) + (D * FF + FF) + (FF * D + D) + (D * 3 + 3)
    tokens = torch.randint(0, TOKENS, (4, 12), generator=_gen())
    return Case(
        build,
        [(tokens, torch.tensor([0, 1, 2, 0]))],
        params=TOKENS * D + cast - (D * 3 + 3) + 2 * 2 * D + (D * 3 + 3),
        tensors=1 + 8 + 4 + 2,
        copies=2 * cast,
        tokens=12,
        reference_loss=_ce_loss,
    )


CASES = ["gpt2", "bert-classification", "bert-regression", "resnet18", "encoder-sdpa"]


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> Case:
    name = request.param
    if name == "encoder-sdpa":
        return _encoder()
    if name == "resnet18":
        return _resnet18(request.getfixturevalue("torchvision"))
    transformers = request.getfixturevalue("transformers")
    if name == "gpt2":
        return _gpt2(transformers)
    return _bert(transformers, 3 if name == "bert-classification" else 1)


def _bytes(data: Any, kind: str) -> dict[str, int]:
    return {r["dtype"]: r["bytes"] for r in data.memory if r["kind"] == kind}


def test_inspect_measures_every_byte_hand_arithmetic_predicts(case: Case, against_policy) -> None:
    model = case.build()
    assert sum(p.numel() for p in model.parameters()) == case.params
    assert len(list(model.parameters())) == case.tensors
    data = pnb.inspect(model, case.batches, "bf16").data
    assert _bytes(data, mem.PARAMS) == {"fp32": 4 * case.params}
    assert _bytes(data, mem.GRADS) == {"fp32": 4 * case.params}
    assert _bytes(data, mem.OPTIM) == {"fp32": 8 * case.params + 4 * case.tensors}
    assert _bytes(data, mem.COPIES) == {"bf16": case.copies}
    copies = [r for r in data.memory if r["kind"] == mem.COPIES]
    assert copies[0]["expected_bytes"] == case.copies
    assert "each parameter autocast cast in this trace once" in copies[0]["method"]
    assert against_policy(data.ops) == []  # every forward op has the dtype its policy says


def test_fit_counts_tokens_in_every_fit_and_the_flops_inspect_counts(case: Case) -> None:
    flops = sum(r["flops"] for r in pnb.inspect(case.build(), case.batches, "bf16").data.ops)
    for _ in range(2):  # the second fit finds its FLOP count cached
        run = pnb.fit(case.build(), case.batches, precision="bf16", steps=2, **FIT)
        assert run.workload["flops_per_step"] == flops > 0
        record = run.records[-1]
        assert math.isfinite(record["loss"])
        if case.tokens is None:
            assert record["tokens_per_s"] is None
        else:
            per_sample = record["tokens_per_s"] / record["samples_per_s"]
            assert per_sample == pytest.approx(case.tokens, rel=1e-12)


def test_compare_and_profile_report_each_plans_rates(case: Case) -> None:
    comparison = pnb.compare(
        ["fp32", "bf16"], model=case.build(), batches=case.batches, steps=2, measure=FAST, **FIT
    )
    assert set(comparison.results) == {"fp32", "bf16"} and not comparison.failures
    for outcome in comparison.outcomes.values():
        tokens = outcome.rates.tokens_per_s
        if case.tokens is None:
            assert tokens is None
        else:
            ratio = tokens / outcome.rates.samples_per_s
            assert ratio == pytest.approx(case.tokens, rel=1e-9)
    profile = pnb.profile(
        case.build(), case.batches, compare=("bf16",), steps=1, rounds=1, inspect=False,
        numerics=False, progress=False,
    )  # fmt: skip
    rates = profile.comparison.outcomes["bf16"].rates
    assert rates.samples_per_s > 0
    assert (rates.tokens_per_s is None) == (case.tokens is None)


def test_numerics_sees_the_loss_the_model_is_trained_on(case: Case) -> None:
    model = case.build()
    with torch.no_grad():
        expected = case.reference_loss(copy.deepcopy(model), case.batches[0]).item()
    result = pnb.numerics(model, case.batches)
    assert result.info["loss"] == pytest.approx(expected, rel=1e-5)
    fp32 = [
        r for r in result.result.gradients if r["variant"] == result.result.gradients[0]["variant"]
    ]
    assert {r["layer"] for r in fp32} == {n for n, _p in model.named_parameters()}
    assert sum(r["elements"] for r in fp32) == case.params


# --------------------------------------------------------------- block-scaled formats (torchao)
BLOCK_FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4")


def _block_tables(case: Case, formats: tuple[str, ...]) -> Any:
    pytest.importorskip("torchao", reason="the test extra installs torchao (the blocks extra)")
    result = pnb.numerics(case.build(), case.batches, formats=formats)
    rows = [r for r in result.result.blocks if r["status"] == "ok"]
    assert {r["format"] for r in rows} == set(formats)
    for r in rows:  # every cast of every layer: finite, fractions in [0, 1]
        assert math.isfinite(r["rel_error"]) and 0 < r["rel_error"] < 1
        assert math.isfinite(r["fp8_rel_error"]) and math.isfinite(r["bf16_rel_error"])
        assert 0 <= r["underflow_fraction"] <= 1 and 0 <= r["saturated_fraction"] <= 1
    casts = {(r["layer"], r["tensor"], r["blocks_along"]) for r in rows}
    assert len(casts) == 6 * len(result.result.gemms)  # six casts per GEMM layer
    return result


def _share(shapes: list[tuple[str, int, int, int]], multiple: int) -> float:
    """Hand count: the share of 6 M K N (a training step's three GEMMs) whose K and N are
    multiples of ``multiple``."""
    total = sum(6 * m * k * n for _, m, k, n in shapes)
    ok = sum(6 * m * k * n for _, m, k, n in shapes if k % multiple == 0 and n % multiple == 0)
    return ok / total


def test_block_formats_on_gpt2_every_projection_and_the_tied_head(transformers) -> None:
    result = _block_tables(_gpt2(transformers), BLOCK_FORMATS)
    m = 4 * T  # every token of the batch, padding included
    shapes = []
    for i in range(LAYERS):  # Conv1D projections: addmm with a (K, N) weight
        shapes += [
            (f"transformer.h.{i}.attn.c_attn", m, E, 3 * E),
            (f"transformer.h.{i}.attn.c_proj", m, E, E),
            (f"transformer.h.{i}.mlp.c_fc", m, E, 4 * E),
            (f"transformer.h.{i}.mlp.c_proj", m, 4 * E, E),
        ]
    shapes.append(("lm_head", m, E, VOCAB))  # tied to wte, named after the Linear using it
    got = [(r["layer"], r["M"], r["K"], r["N"]) for r in result.result.gemms]
    assert got == shapes
    info = result.result.blocks_info
    assert info["qualifying_share"]["mx"] == pytest.approx(_share(shapes, 32), rel=1e-12)
    assert info["qualifying_share"]["fp8"] == pytest.approx(_share(shapes, 16), rel=1e-12)
    keep = info["keep"]["mxfp8_e4m3"]
    kept = {k["layer"] for k in keep["keep"]}
    assert {"transformer.h.0.attn.c_attn", "lm_head"} <= kept  # first and last GEMM layers


def test_block_formats_on_resnet18_convolutions_as_implicit_gemms(torchvision) -> None:
    result = _block_tables(_resnet18(torchvision), ("mxfp8_e4m3", "nvfp4"))
    batch, side = 2, 32
    side //= 2  # the 7x7 stride-2 stem
    shapes = [("conv1", batch * side * side, 3 * 7 * 7, 64)]
    side //= 2  # max pool
    c_in = 64
    for stage, width in enumerate((64, 128, 256, 512), start=1):
        if width != c_in:
            side //= 2  # the first block of a widening stage has stride 2
        m = batch * side * side
        shapes += [
            (f"layer{stage}.0.conv1", m, c_in * 9, width),
            (f"layer{stage}.0.conv2", m, width * 9, width),
        ]
        if width != c_in:
            shapes.append((f"layer{stage}.0.downsample.0", m, c_in, width))
        shapes += [
            (f"layer{stage}.1.conv1", m, width * 9, width),
            (f"layer{stage}.1.conv2", m, width * 9, width),
        ]
        c_in = width
    shapes.append(("fc", batch, 512, 10))
    got = sorted((r["layer"], r["M"], r["K"], r["N"]) for r in result.result.gemms)
    assert got == sorted(shapes)
    info = result.result.blocks_info
    assert info["qualifying_share"]["mx"] == pytest.approx(_share(shapes, 32), rel=1e-12)
    assert info["qualifying_share"]["nvfp4"] == pytest.approx(_share(shapes, 16), rel=1e-12)
    kept = {k["layer"] for k in info["keep"]["nvfp4"]["keep"]}
    assert {"conv1", "fc"} <= kept  # the stem (K = 147) and the classifier (N = 10)
