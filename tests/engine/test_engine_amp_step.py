"""AmpStep: one precision step per plan, and the torch internals it relies on (pinned)."""

import pytest
import torch
from torch import nn

from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import resolve_precision
from precision_nb.engine.amp_step import (
    AmpStep,
    AutocastStep,
    ScaledStep,
    found_inf,
    poison_gradient,
)

CPU = torch.device("cpu")


def plan_of(mode, lab=False):
    return resolve_precision(PrecisionConfig(mode=mode, loss_scale_lab=lab), CPU)


def lab_step(init_scale=256.0):
    return AmpStep.for_plan(plan_of("fp16", lab=True), CPU, {"init_scale": init_scale})


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


def test_for_plan_picks_one_step_per_plan():
    assert type(AmpStep.for_plan(plan_of("fp32"), CPU)) is AmpStep
    assert type(AmpStep.for_plan(plan_of("bf16"), CPU)) is AutocastStep
    scaled = lab_step()
    assert type(scaled) is ScaledStep and scaled.scaler is not None
    with AmpStep.for_plan(plan_of("bf16"), CPU).forward_context():
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
        assert float(found_inf(scaler, opt)) == expected
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


def test_state_dict_round_trip_and_base_has_no_state():
    amp = lab_step(64.0)
    model, opt = model_and_opt()
    backward(amp, model, poison=True)
    amp.step(opt)
    other = lab_step(1024.0)
    other.load_state_dict(amp.state_dict())
    assert other.state_dict()["scale"] == 32.0
    fp32 = AmpStep.for_plan(plan_of("fp32"), CPU)
    assert fp32.state_dict() == {} and fp32.scale_tensor() is None and fp32.scale_value() is None


def test_skip_nonfinite_skips_on_the_host_without_a_scaler():
    amp = AmpStep.for_plan(plan_of("fp32"), CPU, skip_nonfinite=True)
    model, opt = model_and_opt()
    before = [p.detach().clone() for p in model.parameters()]
    backward(amp, model)
    out = amp.step(opt, loss=torch.tensor(float("nan")))
    assert out.stepped is False and out.found_inf is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert amp.step(opt, loss=torch.tensor(1.0)).stepped is True
