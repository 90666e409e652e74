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


# --- atomic loading: every entry checked before anything is applied ---------------------------


def _state_of(t: Trainer) -> dict:
    import copy
    import random

    return {
        "weights": {k: v.clone() for k, v in t.model.state_dict().items()},
        "optimizer": copy.deepcopy(t.optimizer.state_dict()),
        "counters": (t.steps_done, t.attempts_done, t.microbatches_done),
        "torch_rng": torch.get_rng_state().clone(),
        "python_rng": random.getstate(),
        "scaler": t.precision.state_dict(),
    }


def _same(a: dict, b: dict) -> bool:
    weights = a["weights"].keys() == b["weights"].keys() and all(
        torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"]
    )
    opt_a, opt_b = a["optimizer"], b["optimizer"]
    optimizer = opt_a["param_groups"] == opt_b["param_groups"] and all(
        torch.equal(torch.as_tensor(opt_a["state"][p][n]), torch.as_tensor(opt_b["state"][p][n]))
        for p in opt_a["state"]
        for n in opt_a["state"][p]
    )
    return (
        weights
        and optimizer
        and opt_a["state"].keys() == opt_b["state"].keys()
        and a["counters"] == b["counters"]
        and torch.equal(a["torch_rng"], b["torch_rng"])
        and a["python_rng"] == b["python_rng"]
        and a["scaler"] == b["scaler"]
    )


def _corrupt(state: dict, entry: str) -> None:
    if entry == "weights":
        state["model"]["0.weight"] = torch.zeros(3, 3)
    elif entry == "optimizer-groups":
        state["optimizer"]["param_groups"] = []
    elif entry == "optimizer-shape":
        first = next(iter(state["optimizer"]["state"].values()))
        first["exp_avg"] = torch.zeros(5)
    elif entry == "counters":
        state["counters"]["steps"] = "x"
    elif entry == "counters-bool":
        state["counters"]["attempts"] = True
    elif entry == "rng-size":
        state["rng"]["torch"] = torch.zeros(7, dtype=torch.uint8)
    elif entry == "rng-python":
        state["rng"]["python"] = (3, [1, 2, 3], None)
    elif entry == "scaler-types":
        state["scaler"] = {
            "scale": "big",
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 2000,
            "_growth_tracker": 0,
        }
    elif entry == "scaler-keys":
        state["scaler"] = {"scale": 1024.0}
    elif entry == "scaler-inf":
        state["scaler"] = {
            "scale": float("inf"),
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 2000,
            "_growth_tracker": 0,
        }


@pytest.mark.parametrize(
    "entry,words",
    [
        ("weights", "does not fit model"),
        ("optimizer-groups", "0 param groups"),
        ("optimizer-shape", "has shape (5,)"),
        ("counters", "counters.steps: invalid value 'x'"),
        ("counters-bool", "counters.attempts: invalid value True"),
        ("rng-size", "rng.torch"),
        ("rng-python", "rng.python"),
        ("scaler-types", "scaler.scale: invalid value 'big'"),
        ("scaler-keys", "scaler: keys"),
        ("scaler-inf", "scaler.scale: invalid value inf"),
    ],
)
def test_one_bad_entry_changes_nothing(tmp_path, make_model, batches, entry, words):
    source = Trainer(make_model(), batches, device="cpu", precision=LAB, train=quiet(steps=2))
    source.fit()
    state = source.state_dict()
    _corrupt(state, entry)
    path = tmp_path / "bad.pt"
    from precision_nb.engine.checkpoint import save_checkpoint

    save_checkpoint(path, state)

    target = Trainer(make_model(seed=3), batches, device="cpu", precision=LAB, train=quiet(steps=1))
    target.fit()  # so the optimizer has state and the counters are not zero
    before = _state_of(target)
    with pytest.raises(ValueError, match="nothing was loaded") as err:
        target.load_checkpoint(path)
    assert words in str(err.value)
    assert _same(before, _state_of(target))


def test_a_good_checkpoint_does_change_the_state(tmp_path, make_model, batches):
    # the counterpart of the test above: _same really sees a load
    source = Trainer(make_model(), batches, device="cpu", train=quiet(steps=2))
    source.fit()
    source.save_checkpoint(tmp_path / "good.pt")
    target = Trainer(make_model(seed=3), batches, device="cpu", train=quiet(steps=1))
    target.fit()
    before = _state_of(target)
    target.load_checkpoint(tmp_path / "good.pt")
    assert not _same(before, _state_of(target))
    assert target.steps_done == 2


def _payload_offset(path) -> tuple[int, int]:
    """(offset, size) of the largest stored entry of a torch zip file: the payload's bytes."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    data = path.read_bytes()
    name_len, extra_len = struct.unpack(
        "<HH", data[info.header_offset + 26 : info.header_offset + 30]
    )
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def test_a_flipped_bit_in_the_payload_is_refused(tmp_path, make_model, batches):
    t = Trainer(make_model(), batches, device="cpu", train=quiet(steps=1))
    t.fit()
    path = tmp_path / "c.pt"
    t.save_checkpoint(path)
    load_checkpoint(path)  # intact: reads
    offset, size = _payload_offset(path)
    data = bytearray(path.read_bytes())
    data[offset + size - 200] ^= 0x04  # inside the last tensor's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="SHA-256"):
        t.load_checkpoint(path)


def test_saving_onto_a_directory_is_refused_and_leaves_no_tmp(tmp_path, make_model, batches):
    t = Trainer(make_model(), batches, device="cpu", train=quiet(steps=1))
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        t.save_checkpoint(tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_a_failed_save_leaves_no_tmp_and_keeps_the_old_file(
    tmp_path, make_model, batches, monkeypatch
):
    from precision_nb.engine import checkpoint as ckpt

    t = Trainer(make_model(), batches, device="cpu", train=quiet(steps=1))
    path = tmp_path / "c.pt"
    t.save_checkpoint(path)
    old = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt.os, "replace", failing_replace)
    with pytest.raises(OSError):
        t.save_checkpoint(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
    assert path.read_bytes() == old


def test_a_version_1_checkpoint_is_still_read(tmp_path, make_model, batches, caplog):
    t = Trainer(make_model(), batches, device="cpu", train=quiet(steps=1))
    t.fit()
    path = tmp_path / "v1.pt"
    torch.save({"format": "precision_nb.checkpoint", "version": 1, **t.state_dict()}, path)
    fresh = Trainer(make_model(seed=4), batches, device="cpu", train=quiet(steps=1))
    fresh.load_checkpoint(path)
    assert fresh.steps_done == 1
    assert "no checksum" in caplog.text
