"""The time split on a model nobody here wrote: Hugging Face GPT-2 from a small config, a dict
batch with its own loss, under fp32 and bf16 (its Conv1D layers call addmm, which autocast
casts)."""

from __future__ import annotations

import pytest
import torch
from split_traces import assert_same_splits, profiled_steps

from precision_nb.engine.time_split import FAMILIES, SplitConfig, split_trainer
from precision_nb.engine.train_config import TrainConfig
from precision_nb.engine.trainer import Trainer

E, LAYERS, VOCAB, B, T = 64, 2, 1000, 4, 16


@pytest.fixture(scope="module")
def splits(transformers):
    config = transformers.GPT2Config(
        n_embd=E, n_layer=LAYERS, n_head=2, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    out = {}
    for mode in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config)
        cfg = TrainConfig(steps=2, progress=False, measure_peak=False)
        trainer = Trainer(model, [batch], device="cpu", precision=mode, train=cfg)
        trainer.fit(2)
        out[mode] = split_trainer(trainer, config=SplitConfig(steps=2, unprofiled=0))
    return out


def test_gpt2_splits_add_up_and_name_its_matmuls(splits) -> None:
    for split in splits.values():
        assert split.available, split.missing
        assert list(split.families) == list(FAMILIES)
        assert sum(split.families.values()) == pytest.approx(split.step_s)
        assert split.families["matmul"] > 0 and split.families["optimizer"] > 0
    # every block's c_attn Conv1D: addmm of (B*T, E) by (E, 3E), in the plan's dtype
    shapes = {(m.op, m.m, m.k, m.n, m.dtype) for m in splits["bf16"].matmuls}
    assert ("addmm", B * T, E, 3 * E, "c10::BFloat16") in shapes
    assert ("addmm", B * T, E, 3 * E, "float") in {
        (m.op, m.m, m.k, m.n, m.dtype) for m in splits["fp32"].matmuls
    }


def test_gpt2_bf16_casts_are_autocasts_and_fp32_has_none(splits) -> None:
    bf16, fp32 = splits["bf16"].casts, splits["fp32"].casts
    assert fp32.autocast_count == 0
    # at least the weight of every Conv1D (4 per block) and the tied lm_head are cast to bf16
    assert bf16.autocast_count >= 4 * LAYERS + 1
    weights = LAYERS * (3 * E * E + E * E + 4 * E * E + 4 * E * E) + VOCAB * E
    assert bf16.autocast_nbytes >= 2 * weights


def test_gpt2_traces_read_from_the_profilers_result_split_the_same(transformers) -> None:
    config = transformers.GPT2Config(
        n_embd=E, n_layer=LAYERS, n_head=2, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    assert_same_splits(profiled_steps(step, steps=2), 2, autocast=True)
