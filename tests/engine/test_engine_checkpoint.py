import pickle

import pytest
import torch
from engine_helpers import quiet

from precision_nb.core.plan import PrecisionConfig
from precision_nb.engine.checkpoint import load_checkpoint
from precision_nb.engine.trainer import Trainer

LAB = PrecisionConfig(mode="fp16", loss_scale_lab=True)


def test_resume_continues_steps_and_matches_an_uninterrupted_run(tmp_path, make_model, batches):
    full = Trainer(make_model(), batches, device="cpu", train=quiet(steps=6, log_every=3))
    full.fit()
    part = Trainer(make_model(), batches, device="cpu", train=quiet(steps=3, log_every=3))
    part.fit()
    part.save_checkpoint(tmp_path / "c.pt")
    resumed = Trainer(make_model(seed=9), batches, device="cpu", train=quiet(steps=3, log_every=3))
    resumed.load_checkpoint(tmp_path / "c.pt")
    result = resumed.fit()
    assert [r["step"] for r in result.records] == [6]
    for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_scaler_state_is_restored_into_the_next_fit(tmp_path, make_model, batches):
    cfg = quiet(steps=4, log_every=4, init_scale=1024.0, overflow_at_steps=(2,))
    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=cfg)
    t.fit()
    assert t.scale_value() == 512.0
    t.save_checkpoint(tmp_path / "s.pt")
    fresh = Trainer(make_model(), batches, device="cpu", precision=LAB, train=quiet(steps=2))
    fresh.load_checkpoint(tmp_path / "s.pt")
    assert fresh.scaler is None  # deferred until the next fit
    result = fresh.fit()
    assert result.scale_history[0]["loss_scale"] == 512.0
    assert any(
        e.kind == "checkpoint" and "restored from checkpoint" in e.message for e in result.events
    )
    again = Trainer(make_model(), batches, device="cpu", precision=LAB, train=quiet(steps=1))
    assert again.fit().scale_history[0]["loss_scale"] == 65536.0  # a fresh scaler otherwise


def test_corrupt_and_foreign_files_are_refused(tmp_path, make_model, batches):
    t = Trainer(make_model(), batches, device="cpu", train=quiet(steps=1))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="corrupt or not a torch file"):
        t.load_checkpoint(bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(ValueError, match="not a precision_nb checkpoint"):
        load_checkpoint(foreign)
    with pytest.raises(ValueError, match="is not a file"):
        load_checkpoint(tmp_path / "missing.pt")


class _Exploit:
    def __reduce__(self):
        return (open, ("/tmp/precision_nb_exploit_marker", "w"))


def test_pickled_code_is_never_executed(tmp_path):
    import os

    marker = "/tmp/precision_nb_exploit_marker"
    if os.path.exists(marker):
        os.remove(marker)
    evil = tmp_path / "evil.pt"
    with open(evil, "wb") as f:
        torch.save({"format": "precision_nb.checkpoint", "x": _Exploit()}, f, pickle_module=pickle)
    with pytest.raises(ValueError, match="nothing was executed"):
        load_checkpoint(evil)
    assert not os.path.exists(marker)


def test_checkpoint_of_another_model_leaves_this_one_untouched(tmp_path, make_model, batches):
    t = Trainer(make_model(), batches, device="cpu", train=quiet(steps=1))
    t.fit()
    t.save_checkpoint(tmp_path / "a.pt")
    other = Trainer(
        torch.nn.Sequential(torch.nn.Linear(8, 3)), batches, device="cpu", train=quiet(steps=1)
    )
    before = [p.clone() for p in other.model.parameters()]
    with pytest.raises(ValueError, match="does not fit model"):
        other.load_checkpoint(tmp_path / "a.pt")
    assert all(torch.equal(a, b) for a, b in zip(before, other.model.parameters(), strict=True))
    assert other.steps_done == 0
