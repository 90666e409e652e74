"""OptimizerConfig validation, the spec's fused probe, and build_optimizer's recorded outcome."""

from __future__ import annotations

import logging

import pytest
import torch

import precision_nb.core.optim as optim_module
from precision_nb import FusedOutcome, OptimizerConfig, build_optimizer, supports_fused_adamw

REAL_ADAMW = torch.optim.AdamW


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _is_fused(optimizer: torch.optim.Optimizer) -> bool:
    return bool(optimizer.defaults.get("fused"))


def _fused_fails(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    def adamw(params, *args, fused=None, **kwargs):
        if fused:
            raise error
        return REAL_ADAMW(params, *args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", adamw)


# --- config ---------------------------------------------------------------------------------


def test_defaults_and_yaml_style_numbers():
    cfg = OptimizerConfig(lr="1e-3", betas=[0.8, 0.99], weight_decay=0)
    assert cfg.lr == 1e-3 and cfg.betas == (0.8, 0.99) and cfg.weight_decay == 0.0
    assert OptimizerConfig().fused is None


@pytest.mark.parametrize("bad", ["yes", "true", 1, 0, "auto"])
def test_fused_must_be_none_true_or_false(bad):
    with pytest.raises(ValueError) as err:
        OptimizerConfig(fused=bad)
    assert "optimizer.fused" in str(err.value) and repr(bad) in str(err.value)
    assert "true (attempt)" in str(err.value)


@pytest.mark.parametrize(
    "field,bad",
    [("lr", 0), ("lr", -1e-3), ("lr", True), ("lr", "fast"), ("eps", 0.0), ("weight_decay", -1)],
)
def test_bad_numbers_name_the_field(field, bad):
    with pytest.raises(ValueError, match=rf"optimizer\.{field}: invalid value"):
        OptimizerConfig(**{field: bad})


@pytest.mark.parametrize("bad", [(0.9,), (0.9, 1.0), "0.9,0.99", (0.9, "x")])
def test_bad_betas(bad):
    with pytest.raises(ValueError, match=r"optimizer\.betas"):
        OptimizerConfig(betas=bad)


# --- supports_fused_adamw (the spec's probe) ------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "meta", torch.device("cpu")])
def test_probe_is_false_off_cuda(device):
    assert supports_fused_adamw(device) is False


def test_probe_on_cuda_builds_a_one_element_fused_adamw(monkeypatch):
    # Stand a CPU parameter in for the CUDA one so the probe's own logic runs here.
    monkeypatch.setattr(
        optim_module, "_one_element_parameter", lambda d: torch.nn.Parameter(torch.zeros(1))
    )
    assert supports_fused_adamw("cuda") is True


@pytest.mark.parametrize("error", [TypeError("fused"), RuntimeError("no kernel"), ValueError("x")])
def test_probe_on_cuda_catches_the_spec_errors(monkeypatch, error):
    monkeypatch.setattr(
        optim_module, "_one_element_parameter", lambda d: torch.nn.Parameter(torch.zeros(1))
    )
    _fused_fails(monkeypatch, error)
    assert supports_fused_adamw("cuda") is False


# --- build_optimizer on CPU -----------------------------------------------------------------


def test_fused_none_on_cpu_is_plain_adamw_and_says_why():
    opt = build_optimizer(_model(), OptimizerConfig(fused=None), "cpu")
    outcome = opt.precision_nb_fused
    assert isinstance(outcome, FusedOutcome)
    assert (outcome.requested, outcome.probed, outcome.used) == (None, False, False)
    assert not _is_fused(opt)
    assert "CPU fused AdamW exists" in outcome.reason


def test_fused_true_on_cpu_uses_torch_cpu_fused_adamw_and_trains():
    model = _model()
    opt = build_optimizer(model, OptimizerConfig(fused=True, lr=1e-2), "cpu")
    assert _is_fused(opt)
    assert (opt.precision_nb_fused.requested, opt.precision_nb_fused.used) == (True, True)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_fused_false_is_plain():
    opt = build_optimizer(_model(), OptimizerConfig(fused=False), "cpu")
    assert not _is_fused(opt)
    assert opt.precision_nb_fused == FusedOutcome(
        False, None, False, opt.precision_nb_fused.reason, "cpu"
    )


def test_failed_requested_fused_falls_back_with_a_warning(monkeypatch, caplog):
    _fused_fails(monkeypatch, RuntimeError("fused kernels unavailable"))
    with caplog.at_level(logging.WARNING, logger="precision_nb"):
        opt = build_optimizer(_model(), OptimizerConfig(fused=True), "cpu")
    assert not _is_fused(opt)
    outcome = opt.precision_nb_fused
    assert (outcome.requested, outcome.used) == (True, False)
    assert "fused kernels unavailable" in outcome.reason
    assert "fused kernels unavailable" in caplog.text


def test_probe_passing_but_real_parameters_failing_is_reported(monkeypatch, caplog):
    # The spec's weakness: the probe succeeds, the construction with the model's parameters
    # fails. Here that is recorded and logged instead of silently becoming plain AdamW.
    monkeypatch.setattr(optim_module, "supports_fused_adamw", lambda device: True)
    _fused_fails(monkeypatch, RuntimeError("params on another device"))
    with caplog.at_level(logging.WARNING, logger="precision_nb"):
        opt = build_optimizer(_model(), OptimizerConfig(fused=None), "cpu")
    outcome = opt.precision_nb_fused
    assert (outcome.probed, outcome.used) == (True, False)
    assert "params on another device" in outcome.reason and "probe" in caplog.text


def test_probe_passing_builds_fused_from_the_real_parameters(monkeypatch):
    monkeypatch.setattr(optim_module, "supports_fused_adamw", lambda device: True)
    opt = build_optimizer(_model(), OptimizerConfig(fused=None), "cpu")
    assert _is_fused(opt) and opt.precision_nb_fused.used


def test_parameters_are_moved_to_the_device_before_building():
    model = _model()
    opt = build_optimizer(model, OptimizerConfig(fused=False), "meta")
    params = opt.param_groups[0]["params"]
    assert all(p.device.type == "meta" for p in params)
    assert {id(p) for p in params} == {id(p) for p in model.parameters()}


def test_optimizer_hyperparameters_are_passed():
    cfg = OptimizerConfig(lr=3e-4, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    group = build_optimizer(_model(), cfg, "cpu").param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (
        3e-4,
        (0.8, 0.95),
        1e-6,
        0.1,
    )


def test_bad_model_and_frozen_model():
    with pytest.raises(ValueError, match="torch.nn.Module"):
        build_optimizer([torch.zeros(1)], None, "cpu")
    frozen = _model().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(frozen, None, "cpu")


# --- the fused decision in an explanation ---------------------------------------------------


def _fused_decision(fused, device="cpu", capabilities="cpu-only"):
    from precision_nb import explain_precision

    e = explain_precision(
        None, device, capabilities=capabilities, optimizer=OptimizerConfig(fused=fused)
    )
    return e.decisions[-1]


def test_explained_fused_none_on_cpu_names_the_cpu_kernel():
    d = _fused_decision(None)
    assert d.outcome == "plain AdamW" and "false off CUDA" in d.reason
    assert "CPU fused AdamW exists" in d.reason and "fused=true" in d.reason


def test_explained_fused_true_on_cpu_attempts_it():
    d = _fused_decision(True)
    assert d.outcome == "fused AdamW" and not d.fallback


def test_explained_fused_true_without_a_cpu_kernel_is_a_fallback(monkeypatch):
    monkeypatch.setattr(optim_module, "_has_fused_kernel", lambda device_type: False)
    d = _fused_decision(True)
    assert d.outcome == "plain AdamW" and d.fallback and "no CPU fused AdamW kernel" in d.reason


def test_explained_fused_on_simulated_cuda_is_not_probed():
    assert _fused_decision(None, "cuda", "cuda-bf16").outcome == "fused AdamW (expected)"
    assert _fused_decision(False, "cuda", "cuda-bf16").outcome == "plain AdamW"


def test_absent_device_is_a_runtime_error(fake_torch):
    fake_torch(cuda=False)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        build_optimizer(_model(), None, "cuda")


def test_plain_adamw_s_implementation_is_read_from_torch_and_no_speed_is_claimed():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    from precision_nb.core.optim import PLAIN_ADAMW_COST, plain_adamw_kind

    # what torch.optim.AdamW itself picks with foreach=None, fused=None for CPU parameters
    _fused, foreach = _default_to_fused_or_foreach([torch.zeros(2)], False, False)
    assert plain_adamw_kind("cpu") == ("foreach" if foreach else "for-loop")
    assert plain_adamw_kind("cuda") == "foreach"  # torch's default on CUDA: multi-tensor ops
    assert f"torch's {plain_adamw_kind('cpu')} implementation" in PLAIN_ADAMW_COST
    assert "time_adamw" in PLAIN_ADAMW_COST
    for claim in ("slower", "faster", "as fast", "kernel"):
        assert claim not in PLAIN_ADAMW_COST  # speed is measured, not asserted
