"""Autocast's policy read from the running torch: the dispatcher's kernels, the measured casts,
their agreement with torch's own autocast tests and with real CPU runs, and every difference from
the documented lists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from precision_nb.engine.inspect import autocast_probe as probe
from precision_nb.engine.inspect import policy, run_inspection
from precision_nb.engine.inspect.op_trace import OpTracer

LOW, FP32, PROMOTE = policy.LOW, policy.FP32, policy.PROMOTE


@pytest.mark.parametrize("device_type", ["cpu", "cuda", "mps"])
def test_registrations_are_the_ops_the_dispatcher_has_autocast_kernels_for(device_type):
    key = probe.DISPATCH_KEYS[device_type]
    scanned = {
        name
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    }
    assert set(probe.registrations(device_type)) == scanned
    assert len(scanned) > 50


@pytest.mark.parametrize("device_type", ["cpu", "cuda", "mps"])
def test_the_cast_of_every_registered_overload_is_measured(device_type):
    unmeasured = [m for m in probe.device_table(device_type) if m.policy is None]
    assert unmeasured == []


def test_the_ops_the_documented_lists_got_wrong_are_measured_right():
    cuda_fp32 = {
        "rms_norm": "rms_norm",
        "logsumexp": "logsumexp",
        "huber_loss": "huber_loss",
        "linalg_vector_norm": "linalg_vector_norm",
        "interpolate": "upsample_nearest2d",  # F.interpolate(mode="nearest")
    }
    for call, op in cuda_fp32.items():
        assert policy.policy_of("cuda", call, op) == FP32, call
    assert policy.policy_of("cuda", "scaled_dot_product_attention") == LOW
    assert policy.policy_of("cuda", "einsum") == LOW
    # CPU: F.grid_sample runs grid_sampler_2d, which autocast casts up (the table said grid_sampler)
    assert policy.policy_of("cpu", "grid_sample", "grid_sampler_2d") == FP32
    assert policy.policy_of("cpu", "rms_norm", "mean") is None  # no CPU kernel: runs as it gets
    evidence = policy.lookup("cuda", "linalg_vector_norm").evidence
    assert evidence == "dtype=float32 handed to the op"
    assert policy.lookup("cuda", "rms_norm").evidence == "bfloat16 arguments cast to float32"


def test_the_cpu_and_cuda_flag_follows_the_measured_policy():
    assert policy.cross_device_difference("rms_norm", "cpu", "mean") == "cuda: float32"
    assert policy.cross_device_difference("logsumexp", "cpu") == "cuda: float32"
    assert policy.cross_device_difference("huber_loss", "cpu") is None  # fp32 on both
    assert policy.cross_device_difference("layer_norm", "cpu", "native_layer_norm") == (
        "cuda: float32"
    )
    assert policy.cross_device_difference("linear", "cuda", "addmm") is None


def _torch_autocast_test_lists():
    path = Path(torch.__file__).parent / "testing/_internal/autocast_test_lists.py"
    if not path.exists():
        pytest.skip("this torch build ships no autocast test lists")
    cuda, cpu = path.read_text().split("class AutocastCPUTestLists")
    lists = {}
    for device, text in (("cuda", cuda), ("cpu", cpu)):
        for name, body in re.findall(r"self\.(\w+) = \[(.*?)\n        \]", text, re.S):
            lists[(device, name)] = set(re.findall(r'^\s*\("(\w+)"', body, re.M))
    return lists


# torch's own autocast tests (test/test_cuda.py, test/test_autocast.py) check these lists on real
# devices; what each list expects of autocast's kernel for its ops:
TEST_LIST_POLICY = {
    ("cuda", "torch_fp16"): LOW,
    ("cuda", "nn_fp16"): LOW,
    ("cuda", "linalg_fp16"): LOW,
    ("cuda", "methods_fp16"): LOW,
    ("cuda", "torch_fp32"): FP32,
    ("cuda", "nn_fp32"): FP32,
    ("cuda", "methods_fp32"): FP32,
    ("cuda", "torch_need_autocast_promote"): PROMOTE,
    ("cuda", "banned"): policy.REFUSED,
    ("cuda", "torch_expect_builtin_promote"): None,  # no kernel: the op promotes by itself
    ("cuda", "methods_expect_builtin_promote"): None,
    ("cpu", "torch_16"): LOW,
    ("cpu", "nn_16"): LOW,
    ("cpu", "torch_fp32"): FP32,
    ("cpu", "nn_fp32"): FP32,
    ("cpu", "torch_need_autocast_promote"): PROMOTE,
    ("cpu", "torch_expect_builtin_promote"): None,
    ("cpu", "methods_expect_builtin_promote"): None,
}


def test_the_measured_policy_is_exactly_what_torchs_own_autocast_tests_expect():
    lists = _torch_autocast_test_lists()
    assert set(lists) == set(TEST_LIST_POLICY), "torch's test lists changed: map the new ones"
    disagreements = [
        (device, name, op, policy.policy_of(device, op), expected)
        for (device, name), expected in TEST_LIST_POLICY.items()
        for op in sorted(lists[(device, name)])
        if policy.policy_of(device, op) != expected
    ]
    assert disagreements == []
    assert sum(len(ops) for ops in lists.values()) > 150


# Every difference between torch 2.13's documented lists ("Autocast Op Reference") and the
# policy measured from its dispatcher: op -> (documented, measured).
_CUDA_KERNELS_THE_REFERENCE_OMITS = {
    **dict.fromkeys(
        """_convolution _scaled_dot_product_flash_attention _thnn_fused_gru_cell
        _thnn_fused_lstm_cell conv_tbc convolution cudnn_convolution cudnn_convolution_transpose
        einsum linalg_vecdot scaled_dot_product_attention""".split(),
        (None, LOW),
    ),
    **dict.fromkeys(
        """_upsample_bicubic2d_aa _upsample_bilinear2d_aa _upsample_nearest_exact1d
        _upsample_nearest_exact2d _upsample_nearest_exact3d frobenius_norm huber_loss
        linalg_matrix_norm linalg_vector_norm logsumexp native_layer_norm nll_loss2d nuclear_norm
        rms_norm upsample_bicubic2d upsample_bilinear2d upsample_linear1d upsample_nearest1d
        upsample_nearest2d upsample_nearest3d upsample_trilinear3d""".split(),
        (None, FP32),
    ),
    "vdot": (None, PROMOTE),
    "binary_cross_entropy": (None, policy.REFUSED),
}
KNOWN_DISAGREEMENTS = {
    "cuda": {
        **_CUDA_KERNELS_THE_REFERENCE_OMITS,
        # Python-level names without an ATen op of their own: their ATen ops carry the kernel
        # (reciprocal, log_softmax + nll_loss, norm), found in a trace by the op that ran
        "__rdiv__": (FP32, None),
        "__rtruediv__": (FP32, None),
        "cross_entropy": (FP32, None),
        "normalize": (FP32, None),
    },
    "cpu": {
        "_addmm_activation": (None, LOW),
        "_grid_sampler_2d_cpu_fallback": (None, FP32),
        "grid_sampler_2d": (None, FP32),
        "grid_sampler_3d": (None, FP32),
    },
}


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_every_disagreement_with_the_documented_lists_is_reported(device_type):
    found = {r["op"]: (r["documented"], r["measured"]) for r in policy.disagreements(device_type)}
    new = {op: v for op, v in found.items() if KNOWN_DISAGREEMENTS[device_type].get(op) != v}
    gone = sorted(set(KNOWN_DISAGREEMENTS[device_type]) - set(found))
    assert (new, gone) == ({}, []), f"new or changed: {new}; no longer disagreeing: {gone}"


def _traced(fn, *args, dtype=torch.bfloat16):
    """Rows of a real CPU run of ``fn`` under autocast (the trace a user would see)."""
    tracer = OpTracer(set())
    with tracer, torch.autocast("cpu", dtype=dtype):
        fn(*args)
    plan = type("Plan", (), {"autocast_enabled": True, "device_type": "cpu", "dtype": dtype})()
    return tracer.rows(plan)


def _compute(rows):
    return [r for r in rows if r["kind"] in ("compute", "in-place") and r["output"] != "bool"]


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


_CPU_CALLS = {
    "linear": (F.linear, (_x(4, 8), _x(3, 8))),
    "conv2d": (F.conv2d, (_x(1, 2, 5, 5), _x(3, 2, 3, 3))),
    "sdpa": (F.scaled_dot_product_attention, (_x(1, 2, 4, 8), _x(1, 2, 4, 8), _x(1, 2, 4, 8))),
    "grid_sample": (
        lambda x, g: F.grid_sample(x, g, align_corners=False),
        (_x(1, 2, 4, 4), _x(1, 3, 3, 2).clamp(-1, 1)),
    ),
    "huber": (F.huber_loss, (_x(4, 3), _x(4, 3))),
    "mse": (F.mse_loss, (_x(4, 3), _x(4, 3))),
    "layer_norm": (lambda x: F.layer_norm(x, (8,)), (_x(4, 8),)),
    "softmax": (lambda x: F.softmax(x, -1), (_x(4, 8),)),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), (_x(4, 8),)),
    "nearest": (lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"), (_x(1, 2, 3, 3),)),
}


@pytest.mark.parametrize("name", sorted(_CPU_CALLS))
def test_the_measured_cpu_policy_predicts_what_a_real_cpu_run_produces(name, against_policy):
    """Independent of the fake-tensor probe: real tensors, real kernels, fp32 and bf16 inputs."""
    fn, args = _CPU_CALLS[name]
    for dtype in (torch.float32, torch.bfloat16):
        rows = _traced(fn, *(a.to(dtype) for a in args))
        assert _compute(rows), (name, dtype)
        assert against_policy(rows) == [], (name, dtype)


class _Attention(nn.Module):
    """An encoder layer (fused CPU attention) with an MLP head, as a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.enc = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(x)).mean(dim=1))


def _project_traces():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (4, 12), generator=gen)
    yield from (
        run_inspection(name, preset="tiny", precision="bf16")
        for name in ("mlp", "transformer", "cnn")
    )
    yield run_inspection(_Attention(), [(tokens, torch.tensor([0, 1, 2, 0]))], "bf16")


def test_every_forward_op_of_the_project_traces_has_the_dtype_its_policy_says(against_policy):
    """Exact for every op the built-in workloads and an encoder model run: the policy measured
    from torch names the dtype each forward op really produced on this CPU (the Hugging Face and
    torchvision models are checked so in tests/models)."""
    checked = set()
    for data in _project_traces():
        assert against_policy(data.ops) == []
        checked |= {
            (r["call"], r["autocast_list"])
            for r in data.ops
            if r["phase"] == "forward" and r["kind"] == "compute"
        }
    calls = {c for c, _p in checked}
    assert {"linear", "scaled_dot_product_attention", "conv2d", "cross_entropy"} <= calls
    assert {p for _c, p in checked} >= {LOW, FP32, None}


def test_measuring_leaves_autocast_state_and_dispatch_modes_as_they_were():
    before = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
    probe.measure.cache_clear()
    probe.measure_name.cache_clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert policy.policy_of("cuda", "rms_norm") == FP32
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == (
            torch.bfloat16
        )
    assert (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")) == before


def test_an_unknown_device_type_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"device_type: invalid value 'xla'; allowed: cpu, cuda"):
        policy.policy_rows("xla")
    assert policy.policy_of("xla", "linear") is None
