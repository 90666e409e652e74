"""torch's documented autocast op lists, kept only to cross-check the policy measured from the
running torch (:mod:`.policy`): the documentation lags the dispatcher.

The lists are those of the "Autocast Op Reference" in torch's documentation (``torch.amp``; the
``autocast`` docstring in ``torch/amp/autocast_mode.py`` points to it), in the reference's own
spellings: torch-level names for CUDA (``linear``, ``__matmul__``, ``cross_entropy``), ATen names
for CPU. :func:`~.policy.disagreements` lists every op where they and the measured policy differ.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType

from precision_nb.engine.inspect.autocast_probe import FP32, LOW, PROMOTE, spellings

SOURCE = "torch's Autocast Op Reference (torch.amp documentation)"

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

DOCUMENTED: Mapping[str, Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        device: MappingProxyType(
            {
                policy: frozenset(names.split())
                for policy, names in zip((LOW, FP32, PROMOTE), lists, strict=True)
            }
        )
        for device, lists in (
            ("cuda", (_CUDA_LOW, _CUDA_FP32, _CUDA_PROMOTE)),
            ("cpu", (_CPU_LOW, _CPU_FP32, _CPU_PROMOTE)),
        )
    }
)


def documented_policy_of(device_type: str, name: str) -> str | None:
    """The documented list an ATen op ``name`` is on for ``device_type``, or None: the reference's
    names are read as a trace reads a torch call (``grid_sample`` -> ``grid_sampler``,
    ``RNNCell`` -> ``rnn_tanh_cell`` and ``rnn_relu_cell``, ``__matmul__`` -> ``matmul``)."""
    return _by_aten_name(device_type).get(name)


@functools.cache
def _by_aten_name(device_type: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for policy in (LOW, FP32, PROMOTE):
        for name in sorted(DOCUMENTED.get(device_type, {}).get(policy, ())):
            for spelled in spellings(name):
                out.setdefault(spelled, policy)
    return out
