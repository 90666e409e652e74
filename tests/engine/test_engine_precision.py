"""Precision: one object per plan, and the torch internals it relies on (pinned)."""

import pytest
import torch
from torch import nn

from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import explain_precision, resolve_precision
from precision_nb.engine.precision import (
    Autocast,
    Precision,
    ScaledAutocast,
    ScalerInternals,
    lab_applies,
    poison_gradient,
    run_label,
)
from precision_nb.engine.train_config import TrainConfig

CPU = torch.device("cpu")


def plan_of(mode, lab=False):
    return resolve_precision(PrecisionConfig(mode=mode, loss_scale_lab=lab), CPU)


def lab_step(init_scale=256.0, **cfg):
    amp = Precision.for_plan(plan_of("fp16", lab=True), CPU, lab=True)
    amp.start_fit(TrainConfig(init_scale=init_scale, **cfg))
    return amp


def model_and_opt(fused=False, seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)


def backward(amp, model, poison=False):
    with amp.forward_context():
        loss = model(torch.ones(3, 4)).float().pow(2).mean()
    amp.backward(loss)
    if poison:
        poison_gradient(list(model.parameters()))
    return loss


def test_for_plan_picks_one_precision_per_plan():
    assert type(Precision.for_plan(plan_of("fp32"), CPU)) is Precision
    assert type(Precision.for_plan(plan_of("bf16"), CPU)) is Autocast
    scaled = lab_step()
    assert type(scaled) is ScaledAutocast and scaled.scaler is not None
    with Precision.for_plan(plan_of("bf16"), CPU).forward_context():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


@pytest.mark.parametrize("fused", [False, True])
def test_torch_keeps_found_inf_per_optimizer_until_update(fused):
    """Pins the private GradScaler layout that found_inf() reads, against the installed torch."""
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    for poison, expected in ((False, 0.0), (True, 1.0)):
        model, opt = model_and_opt(fused)
        scaler.scale(model(torch.ones(3, 4)).sum()).backward()
        if poison:
            poison_gradient(list(model.parameters()))
        scaler.step(opt)
        per_device = scaler._per_optimizer_states[id(opt)]["found_inf_per_device"]
        assert [float(v) for v in per_device.values()] == [expected]
        assert float(ScalerInternals.found_inf(scaler, opt)) == expected
        assert [t.dtype for t in ScalerInternals.tensors(scaler)] == [torch.float32, torch.int32]
        scaler.update()


@pytest.mark.parametrize("fused", [False, True])
def test_scaled_step_skips_from_found_inf_and_reports_on_device(fused):
    amp = lab_step(256.0)
    model, opt = model_and_opt(fused)
    before = [p.detach().clone() for p in model.parameters()]
    backward(amp, model, poison=True)
    out = amp.step(opt, clip=1.0, params=list(model.parameters()))
    opt.zero_grad()
    assert out.scale.device == CPU and float(out.scale) == 256.0 and float(out.found_inf) == 1.0
    assert out.grad_norm is not None and amp.scale_value() == 128.0
    assert out.stepped is (None if fused else False)  # fused: only the device knows
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    backward(amp, model)
    out = amp.step(opt)
    assert float(out.found_inf) == 0.0 and out.stepped is (None if fused else True)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_at_scale_zero_torch_finds_no_inf_so_the_floor_must_stop_it():
    """Pins torch: at scale 0 the grads are 0 before unscaling, the inf check passes and the step
    runs. Neither the scale going down nor found_inf can see it; ``min_loss_scale`` does."""
    amp = lab_step(1.0)
    model, opt = model_and_opt()
    backward(amp, model)
    amp.scaler.update(0.0)
    backward(amp, model)
    out = amp.step(opt)
    assert float(out.scale) == 0.0 and float(amp.scale_tensor()) == 0.0
    assert float(out.found_inf) == 0.0 and out.stepped is True
    assert all(torch.isnan(p).all() for p in model.parameters())  # unscaled by 1/0: NaN


def test_state_dict_round_trip_and_base_has_no_state():
    amp = lab_step(64.0)
    model, opt = model_and_opt()
    backward(amp, model, poison=True)
    amp.step(opt)
    other = lab_step(1024.0)
    other.load_state_dict(amp.state_dict())
    assert other.state_dict()["scale"] == 32.0  # kept for the next fit, which restores it
    events = other.start_fit(TrainConfig(init_scale=1024.0))
    assert other.scale_value() is None  # a fresh scaler: its scale tensor is made on first use
    backward(other, model_and_opt()[0])
    assert other.scale_value() == 32.0 and "restored" in events[0].message
    fp32 = Precision.for_plan(plan_of("fp32"), CPU)
    assert fp32.state_dict() == {} and fp32.scale_tensor() is None and fp32.scale_value() is None


def test_skip_nonfinite_skips_on_the_host_without_a_scaler():
    amp = Precision.for_plan(plan_of("fp32"), CPU)
    amp.start_fit(TrainConfig(skip_nonfinite=True))
    model, opt = model_and_opt()
    before = [p.detach().clone() for p in model.parameters()]
    backward(amp, model)
    out = amp.step(opt, loss=torch.tensor(float("nan")))
    assert out.stepped is False and out.found_inf is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert amp.step(opt, loss=torch.tensor(1.0)).stepped is True


def test_the_floor_check_reads_the_scale_only_when_skips_could_have_reached_the_floor(
    monkeypatch,
):
    amp = lab_step(8.0, min_loss_scale=1.0)
    model, opt = model_and_opt()
    reads = []
    real = amp.scale_value
    monkeypatch.setattr(amp, "scale_value", lambda: reads.append(1) or real())
    for expected_reads in (0, 0, 0, 1):  # 8 -> at worst 4, 2, 1 (still the floor), then 0.5
        assert amp.scale_below_floor() is None and len(reads) == expected_reads
        backward(amp, model, poison=True)
        amp.step(opt)
        opt.zero_grad()
    assert amp.scale_below_floor() == 0.5 and len(reads) == 2  # read: below, the run must stop


def test_a_restored_scale_below_the_floor_stops_before_the_first_attempt():
    amp = Precision.for_plan(plan_of("fp16", lab=True), CPU, lab=True)
    donor = lab_step(0.5, min_loss_scale=0.25)
    model, opt = model_and_opt()
    backward(donor, model)
    donor.step(opt)
    amp.load_state_dict(donor.state_dict())
    amp.start_fit(TrainConfig(min_loss_scale=1.0))
    assert amp.scale_below_floor() == 0.5


def test_label_lab_and_what_a_precision_without_a_scaler_cannot_use():
    lab = explain_precision(PrecisionConfig(mode="fp16", loss_scale_lab=True), "cpu")
    cuda = explain_precision(
        PrecisionConfig(mode="fp16", loss_scale_lab=True), "cuda", capabilities="cuda-bf16"
    )
    assert lab_applies(lab) and not lab_applies(cuda)  # CUDA fp16 has the real scaler
    assert run_label("fp16", True) == "fp16 (loss-scale lab)" and run_label("bf16", False) == "bf16"
    assert Precision.for_plan(lab.plan, CPU, lab=True).label == "fp16 (loss-scale lab)"
    fp32 = Precision.for_plan(plan_of("fp32"), CPU)
    fp32.load_state_dict({"scale": 4.0})
    events = fp32.start_fit(TrainConfig(overflow_at_steps=(1,)))
    assert [e.kind for e in events] == ["checkpoint", "warning"]
    assert "not used" in events[0].message and "ignored" in events[1].message
    model, opt = model_and_opt()
    backward(fp32, model)
    fp32.inject_overflow(1, list(model.parameters()))  # no scaler: nothing injected
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_lab_injects_an_overflow_on_the_attempts_it_was_asked_for():
    amp = Precision.for_plan(plan_of("fp16", lab=True), CPU, lab=True)
    amp.start_fit(TrainConfig(overflow_at_steps=(2,)), attempts_done=3)  # this fit's 2nd: 5
    model, _opt = model_and_opt()
    backward(amp, model)
    amp.inject_overflow(2, list(model.parameters()))
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    amp.inject_overflow(5, list(model.parameters()))
    assert not all(torch.isfinite(p.grad).all() for p in model.parameters())
