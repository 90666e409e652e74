"""Autocast's op policy as torch documents it: which ops autocast runs in low precision, in fp32,
or at the widest input type, on CUDA and on CPU.

This is **documented policy, not a trace**: the lists of the "Autocast Op Reference" in torch's
documentation (``torch.amp``; the ``autocast`` docstring in ``torch/amp/autocast_mode.py`` points
to it), kept here as data. Where a device is simulated (a capability preset) nothing can run on
it, so the inspection shows this table instead of a trace; on a real device the trace says what
really ran and the table only names *why* (an op on the fp32 list was kept in fp32 by autocast).

Names are the torch-level spellings of the reference (``linear``, ``layer_norm``,
``cross_entropy``, ``__matmul__``); CPU names follow the reference's own (ATen) spellings.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

SOURCE = (
    "documented policy, not a trace: torch's Autocast Op Reference (torch.amp docs) for "
    f"torch {torch.__version__.split('+')[0]}"
)

#: The reference's list names: the dtype an op autocasts to.
LOW = "lower precision"  # float16 on CUDA ("Ops that can autocast to float16"), bf16 or fp16 on CPU
FP32 = "float32"
PROMOTE = "widest input type"

_CUDA_LOW = """__matmul__ addbmm addmm addmv addr baddbmm bmm chain_matmul multi_dot conv1d conv2d
conv3d conv_transpose1d conv_transpose2d conv_transpose3d GRUCell linear LSTMCell matmul mm mv
prelu RNNCell"""
_CUDA_FP32 = """__pow__ __rdiv__ __rpow__ __rtruediv__ acos asin binary_cross_entropy_with_logits
cosh cosine_embedding_loss cdist cosine_similarity cross_entropy cumprod cumsum dist erfinv exp
expm1 group_norm hinge_embedding_loss kl_div l1_loss layer_norm log log_softmax log10 log1p log2
margin_ranking_loss mse_loss multilabel_margin_loss multi_margin_loss nll_loss norm normalize
pdist poisson_nll_loss pow prod reciprocal rsqrt sinh smooth_l1_loss soft_margin_loss softmax
softmin softplus sum renorm tan triplet_margin_loss"""
_CUDA_PROMOTE = """addcdiv addcmul atan2 bilinear cross dot grid_sample index_put scatter_add
tensordot"""

_CPU_LOW = """conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm addbmm linear _convolution
matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d conv_transpose3d prelu
scaled_dot_product_attention _native_multi_head_attention"""
_CPU_FP32 = """avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft
cdist trace view_as_complex cholesky cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr
pinverse max_pool3d max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d
reflection_pad2d replication_pad1d replication_pad2d replication_pad3d mse_loss
cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss poisson_nll_loss smooth_l1_loss
cross_entropy_loss l1_loss huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss
multi_margin_loss ctc_loss kl_div multilabel_margin_loss binary_cross_entropy_with_logits fft_fft
fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn
fft_irfftn fft_hfft fft_ihfft linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky
linalg_svdvals linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product
linalg_tensorinv linalg_tensorsolve fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd
triangular_solve fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d
multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh
linalg_lstsq linalg_inv_ex"""
_CPU_PROMOTE = "stack cat index_copy"

POLICY: Mapping[str, Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "cuda": MappingProxyType(
            {
                LOW: frozenset(_CUDA_LOW.split()),
                FP32: frozenset(_CUDA_FP32.split()),
                PROMOTE: frozenset(_CUDA_PROMOTE.split()),
            }
        ),
        "cpu": MappingProxyType(
            {
                LOW: frozenset(_CPU_LOW.split()),
                FP32: frozenset(_CPU_FP32.split()),
                PROMOTE: frozenset(_CPU_PROMOTE.split()),
            }
        ),
    }
)

# torch-level names that the reference spells differently on one device (the CPU lists use ATen
# names: F.cross_entropy reaches autocast as cross_entropy_loss).
_ALIASES = {"cross_entropy": ("cross_entropy_loss",), "cross_entropy_loss": ("cross_entropy",)}


def policy_of(device_type: str, name: str | None) -> str | None:
    """The documented list (``LOW``, ``FP32``, ``PROMOTE``) ``name`` is on for ``device_type``.

    ``name`` is a torch-level op name (``"linear"``, ``"softmax"``) or an ATen packet name; a
    leading underscore and a ``_forward`` suffix are tried too (``_log_softmax`` ->
    ``log_softmax``). ``None`` when the op is on no list, or the device type has no table (MPS
    and others: autocast's MPS policy is not part of the reference kept here).
    """
    lists = POLICY.get(device_type)
    if lists is None or not name:
        return None
    candidates = [name, name.lstrip("_")]
    for suffix in ("_forward", "_backward"):
        if name.endswith(suffix):
            candidates.append(name[: -len(suffix)].lstrip("_"))
    for cand in list(candidates):
        candidates.extend(_ALIASES.get(cand, ()))
    for policy in (LOW, FP32, PROMOTE):
        if any(c in lists[policy] for c in candidates):
            return policy
    return None


def policy_rows(device_type: str, dtype: Any = None) -> list[dict[str, Any]]:
    """The documented table for ``device_type`` as plain rows (op, policy, dtype, source).

    ``dtype`` is the plan's autocast dtype, written into the ``dtype`` column of the
    lower-precision list (the reference lists float16 for CUDA; CUDA bf16 autocast uses the same
    list). Raises ``ValueError`` for a device type without a table.
    """
    lists = POLICY.get(device_type)
    if lists is None:
        raise ValueError(
            f"device_type: invalid value {device_type!r}; allowed: {', '.join(POLICY)} "
            "(the documented autocast lists kept here)"
        )
    low = str(dtype).replace("torch.", "") if dtype is not None else "float16 / bfloat16"
    out_dtype = {LOW: low, FP32: "float32", PROMOTE: "widest input"}
    return [
        {"op": op, "policy": policy, "dtype": out_dtype[policy], "source": SOURCE}
        for policy in (LOW, FP32, PROMOTE)
        for op in sorted(lists[policy])
    ]


def cross_device_difference(name: str | None, device_type: str) -> str | None:
    """The other device's documented list for ``name`` where it differs from ``device_type``'s.

    Returns e.g. ``"cuda: float32"`` for ``layer_norm`` on CPU (autocast keeps it in fp32 on
    CUDA, not on CPU), or ``None`` when both devices agree or ``device_type`` has no table.
    """
    if device_type not in POLICY or not name:
        return None
    here = policy_of(device_type, name)
    for other in POLICY:
        if other == device_type:
            continue
        there = policy_of(other, name)
        if there != here and FP32 in (here, there):
            return f"{other}: {there or 'on no list'}"
    return None
