"""The whole Mamba-2 layer function (mamba-ssm's ``mamba_split_conv1d_scan_combined``) written once over its
parts: the causal conv1d, the SSD call and the gated RMSNorm, glued by the split, the SwiGLU of the non-SSM
features and the out projection.

Two sets of parts run through it: the pure-PyTorch references (``mamba2_kernels.layer_naive``, the fp64 ground
truth) and, under ``torch.compile``, the drop-in's own operators (``mamba2_kernels.layer_fn``), so that Dynamo
sees three opaque operators and plain tensor ops it can trace and Inductor can fuse.

``parts`` has three callables:
  conv(x (b, d, L), weight, bias, seq_idx, activation) -> (b, d, L);
  ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit, state_dtype)
      -> (y, final_states), with dt_softplus on, as the layer calls it;
  norm(x (rows, d), weight, eps, z (rows, d), group_size, norm_before_gate) -> (rows, d).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

INF = float("inf")


def mamba_split_conv1d_scan(parts: Any, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                            initial_states=None, seq_idx=None, dt_limit=(0.0, INF), return_final_states=False,
                            activation="silu", rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None,
                            outproj_bias=None, headdim=None, ngroups=1, norm_before_gate=True, state_dtype=None):
    """The layer over ``parts`` (module docstring); arguments and results as mamba-ssm's function."""
    nheads = D.shape[0]
    headdim = D.shape[1] if D.dim() == 2 else headdim
    dim = nheads * headdim
    dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
    d_nonssm = (zxbcdt.shape[-1] - 2 * dim - 2 * ngroups * dstate - nheads) // 2
    batch, seqlen, _ = zxbcdt.shape
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    xBC = parts.conv(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx, activation).transpose(1, 2)
    x, B, C = torch.split(xBC, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    z = z.unflatten(-1, (nheads, headdim))
    y, final_states = parts.ssd(x.unflatten(-1, (nheads, headdim)), dt, A, B.unflatten(-1, (ngroups, dstate)),
                                C.unflatten(-1, (ngroups, dstate)), chunk_size, D,
                                None if rmsnorm_weight is not None else z, dt_bias, initial_states, seq_idx, dt_limit,
                                state_dtype)
    y = y.flatten(-2)
    if rmsnorm_weight is not None:
        y = parts.norm(y.reshape(-1, dim), rmsnorm_weight, rmsnorm_eps, z.reshape(-1, dim), dim // ngroups,
                       norm_before_gate).view(batch, seqlen, dim)
    if d_nonssm:
        a, b = zx0.chunk(2, dim=-1)
        y = torch.cat([F.silu(a) * b, y.to(zx0.dtype)], dim=-1)
    if outproj_weight is not None:
        y = F.linear(y, outproj_weight, outproj_bias)
    return (y, final_states) if return_final_states else y
