"""Nothing silently wrong: skips, the scale floor, fallbacks, the autocast check, bad input."""

import logging

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import quiet

from precision_nb.core.amp import AutocastCheck, make_grad_scaler
from precision_nb.core.optim import FusedOutcome, OptimizerConfig
from precision_nb.core.plan import PrecisionConfig
from precision_nb.core.resolution import explain_precision, resolve_precision
from precision_nb.engine import run_setup as preflight
from precision_nb.engine.entry import fit
from precision_nb.engine.results import LossScaleFloorError, NonFiniteLossError
from precision_nb.engine.trainer import TrainConfig, Trainer

LAB = PrecisionConfig(mode="fp16", loss_scale_lab=True)


def test_an_overflow_storm_counts_no_step_and_stops_at_the_floor(make_model, batches):
    # every attempt overflows; a floor below float32's smallest scale lets the scale reach 0.0
    cfg = quiet(steps=5, overflow_at_steps=tuple(range(1, 400)), min_loss_scale=1e-300)
    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=cfg)
    before = [p.detach().clone() for p in t.model.parameters()]
    with pytest.raises(LossScaleFloorError, match=r"loss scale fell below the floor: 0 ") as info:
        t.fit()
    result = info.value.result
    assert result.steps == 0 and t.steps_done == 0 and info.value.scale == 0.0
    assert result.skipped_total == result.attempts > 100
    assert all(torch.equal(a, b) for a, b in zip(before, t.model.parameters(), strict=True))
    event = result.events[-1]
    assert event.kind == "scaler" and event.data["scale"] == 0.0 and event.data["step"] == 0


def test_the_default_floor_names_scale_step_and_what_to_change(make_model, batches):
    cfg = quiet(steps=30, log_every=5, init_scale=8.0, overflow_at_steps=(3, 4, 5, 6))
    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=cfg)
    with pytest.raises(LossScaleFloorError) as info:
        t.fit()
    msg = str(info.value)
    assert "0.5 after attempt 6 (step 2" in msg and "train.min_loss_scale=1" in msg
    assert "learning rate" in msg and info.value.result.steps == 2


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0, -1.0, "big"])
def test_scaler_settings_must_be_finite_and_positive(value):
    with pytest.raises(ValueError, match="train.init_scale"):
        TrainConfig(init_scale=value)
    plan = resolve_precision(LAB, torch.device("cpu"))
    with pytest.raises(ValueError, match="scaler.init_scale"):
        make_grad_scaler(plan, init_scale=value)


@pytest.mark.parametrize("plan", [None, "fp16"])
def test_make_grad_scaler_wants_a_plan(plan):
    with pytest.raises(ValueError, match="plan: invalid value.*PrecisionPlan"):
        make_grad_scaler(plan)


def test_a_loss_the_scaler_cannot_skip_is_not_blamed_on_a_missing_scaler(make_model, batches):
    def loss_fn(out, y):
        return F.cross_entropy(out.float(), y) + torch.tensor(float("inf"))  # finite grads

    t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=quiet(steps=3))
    t.loss_fn = loss_fn
    with pytest.raises(NonFiniteLossError) as info:
        t.fit()
    assert "no grad scaler" not in str(info.value) and "did not skip" in str(info.value)


def test_a_plan_fallback_is_an_event_and_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="precision_nb"):
        result = fit("mlp", precision="fp16", device="cpu", train=quiet(steps=2))
    fallbacks = [e for e in result.events if e.kind == "fallback"]
    assert [e.data for e in fallbacks] == [{"field": "mode", "requested": "fp16", "used": "fp32"}]
    assert any("falls back to fp32" in r.getMessage() for r in caplog.records)


def test_a_fused_adamw_fallback_is_an_event():
    explanation = explain_precision("fp32", "cpu")
    failed = FusedOutcome(True, True, False, "fused=True: building fused AdamW failed", "cpu")
    events = preflight.fallback_events(explanation, failed)
    assert [e.data for e in events] == [
        {"field": "fused AdamW", "requested": True, "used": "plain AdamW"}
    ]
    asked_not = FusedOutcome(None, False, False, "probe is false off CUDA", "cpu")
    assert preflight.fallback_events(explanation, asked_not) == []


def test_every_fit_checks_autocast_and_warns_on_a_mismatch(
    make_model, batches, monkeypatch, caplog
):
    result = fit(make_model(), batches, precision="bf16", train=quiet(steps=1))
    verify = [e for e in result.events if e.kind == "verify"]
    assert [e.data for e in verify] == [
        {"requested": "torch.bfloat16", "computed": "torch.bfloat16", "ok": True}
    ]

    def liar(plan, device):
        return AutocastCheck(plan.dtype, torch.float32, False, "computed in torch.float32")

    monkeypatch.setattr(preflight, "verify_autocast", liar)
    with caplog.at_level(logging.WARNING, logger="precision_nb"):
        result = fit(make_model(), batches, precision="bf16", train=quiet(steps=1))
    assert [e.data["ok"] for e in result.events if e.kind == "verify"] == [False]
    assert any("autocast check" in r.getMessage() for r in caplog.records)


def test_the_autocast_check_does_not_move_the_seeded_rng(make_model, batches):
    losses = [
        fit(make_model(), batches, train=quiet(steps=2, log_every=1)).records[0]["loss"]
        for _ in range(2)
    ]
    assert losses[0] == losses[1]


def test_a_non_scalar_loss_fn_is_named_with_its_shape(make_model, batches):
    def per_sample(out, y):
        return F.cross_entropy(out, y, reduction="none")

    with pytest.raises(ValueError, match=r"loss_fn 'per_sample' returned .*shape \(8,\).*scalar"):
        fit(make_model(), batches, loss_fn=per_sample, train=quiet(steps=1))


def test_lr_schedule_advances_on_counted_steps_only(make_model, batches):
    def step_lrs(overflow):
        cfg = quiet(steps=5, warmup_steps=4, init_scale=64.0, overflow_at_steps=overflow)
        t = Trainer(make_model(), batches, device="cpu", precision=LAB, train=cfg)
        lrs = []
        t.optimizer.register_step_post_hook(lambda opt, a, k: lrs.append(opt.param_groups[0]["lr"]))
        t.fit()
        return lrs

    assert step_lrs((2, 3)) == step_lrs(()) == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(init_scale="big"), "train.init_scale"),
        (dict(overflow_at_steps=5), "train.overflow_at_steps"),
        (dict(min_lr_ratio=None), "train.min_lr_ratio"),
        (dict(seed="x"), "train.seed"),
        (dict(seed=2**70), "train.seed"),
        (dict(steps=10**12), "train.steps"),
        (dict(min_loss_scale=float("nan")), "train.min_loss_scale"),
        (dict(backoff_factor=1.0), "train.backoff_factor"),
        (dict(growth_factor=1.0), "train.growth_factor"),
    ],
)
def test_bad_train_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**kwargs)


def test_seeds_torch_accepts_are_accepted(make_model, batches):
    for seed in (2**64 - 1, -(2**63)):
        assert fit(make_model(), batches, train=quiet(steps=1, seed=seed)).steps == 1


def test_fit_with_too_many_steps_is_refused_before_it_starts(make_model, batches):
    with pytest.raises(ValueError, match=r"train.steps.*10000000"):
        fit(make_model(), batches, steps=10**12)


def test_huge_learning_rate_is_a_value_error():
    with pytest.raises(ValueError, match="optimizer.lr"):
        OptimizerConfig(lr=10**400)


def test_batches_returning_none_later_is_named(make_model, batches):
    def source(i):
        return None if i == 3 else batches(i)

    with pytest.raises(ValueError, match="batches returned None for microbatch 3"):
        fit(make_model(), source, train=quiet(steps=5))
