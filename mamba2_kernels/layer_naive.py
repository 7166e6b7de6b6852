"""Pure-PyTorch reference of the whole Mamba-2 layer function: mamba-ssm's
``mamba_split_conv1d_scan_combined`` composed (``mamba2_kernels.layer_compose``) from the references of its parts
(``mamba2_kernels.conv.naive``, ``mamba2_kernels.ssd.naive.ssd_chunked_ref``, ``mamba2_kernels.norm.naive``).
Differentiable; runs in the dtype of its inputs (fp64 for the guard's precision checks).
"""

from __future__ import annotations

import functools
import types

from mamba2_kernels import layer_compose
from mamba2_kernels.conv import naive as conv_naive
from mamba2_kernels.norm import naive as norm_naive
from mamba2_kernels.ssd import naive as ssd_naive


def _conv(x, weight, bias, seq_idx, activation):
    return conv_naive.causal_conv1d_fwd(x, weight, bias, seq_idx=seq_idx, activation=activation)


def _ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit, state_dtype):
    return ssd_naive.ssd_chunked_ref(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                     initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True,
                                     dt_limit=dt_limit, return_final_states=True, state_dtype=state_dtype)


def _norm(x, weight, eps, z, group_size, norm_before_gate):
    return norm_naive.gated_rmsnorm_fwd(x, weight, None, eps, z=z, group_size=group_size,
                                        norm_before_gate=norm_before_gate)[0]


REFERENCE_PARTS = types.SimpleNamespace(conv=_conv, ssd=_ssd, norm=_norm)
mamba_split_conv1d_scan_ref = functools.partial(layer_compose.mamba_split_conv1d_scan, REFERENCE_PARTS)
