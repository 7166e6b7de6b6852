"""Pure-PyTorch reference of the whole Mamba-2 layer function: mamba-ssm's
``mamba_split_conv1d_scan_combined`` composed from the references of its parts (``mamba2_kernels.conv.naive``,
``mamba2_kernels.ssd.naive.ssd_chunked_ref``, ``mamba2_kernels.norm.naive``, F.linear). Differentiable; runs in the
dtype of its inputs (fp64 for the guard's precision checks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mamba2_kernels.conv import naive as conv_naive
from mamba2_kernels.norm import naive as norm_naive
from mamba2_kernels.ssd import naive as ssd_naive

INF = float("inf")


def mamba_split_conv1d_scan_ref(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states=None,
                                seq_idx=None, dt_limit=(0.0, INF), return_final_states=False, activation="silu",
                                rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None,
                                headdim=None, ngroups=1, norm_before_gate=True):
    """mamba-ssm's ``mamba_split_conv1d_scan_combined`` composed from the references (differentiable)."""
    nheads = D.shape[0]
    headdim = D.shape[1] if D.dim() == 2 else headdim
    dim = nheads * headdim
    dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
    d_nonssm = (zxbcdt.shape[-1] - 2 * dim - 2 * ngroups * dstate - nheads) // 2
    batch, seqlen, _ = zxbcdt.shape
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    xBC = conv_naive.causal_conv1d_fwd(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx=seq_idx,
                                       activation=activation).transpose(1, 2)
    x, B, C = torch.split(xBC, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    z = z.unflatten(-1, (nheads, headdim))
    y, final_states = ssd_naive.ssd_chunked_ref(
        x.unflatten(-1, (nheads, headdim)), dt, A, B.unflatten(-1, (ngroups, dstate)),
        C.unflatten(-1, (ngroups, dstate)), chunk_size, D=D, z=None if rmsnorm_weight is not None else z,
        dt_bias=dt_bias, initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True, dt_limit=dt_limit,
        return_final_states=True)
    y = y.flatten(-2)
    if rmsnorm_weight is not None:
        y = norm_naive.gated_rmsnorm_fwd(y.reshape(-1, dim), rmsnorm_weight, None, rmsnorm_eps, z=z.reshape(-1, dim),
                                         group_size=dim // ngroups, norm_before_gate=norm_before_gate)[0]
        y = y.view(batch, seqlen, dim)
    if d_nonssm:
        a, b = zx0.chunk(2, dim=-1)
        y = torch.cat([F.silu(a) * b, y], dim=-1)
    if outproj_weight is not None:
        y = F.linear(y, outproj_weight, outproj_bias)
    return (y, final_states) if return_final_states else y
