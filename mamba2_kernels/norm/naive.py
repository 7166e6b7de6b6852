"""Pure-PyTorch references of the gated RMSNorm, with the signatures of mamba-ssm's wrappers
``_layer_norm_fwd`` / ``_layer_norm_bwd`` (``mamba_ssm/ops/triton/layernorm_gated.py``), RMS case.

y = rmsnorm(x * silu(z)) * w + b        (norm_before_gate=False)
y = rmsnorm(x) * w * silu(z) + b        (norm_before_gate=True; bias added before the gate)
The normalisation is over groups of ``group_size`` features. ``rstd`` is stored group-major,
shape (ngroups * M,), as mamba-ssm stores it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _forward(x, weight, bias, eps, z, group_size, norm_before_gate):
    M, N = x.shape
    group_size = group_size or N
    if z is not None and not norm_before_gate:
        x = x * F.silu(z)
    grouped = x.view(M, N // group_size, group_size)
    rstd = torch.rsqrt(grouped.square().mean(-1, keepdim=True) + eps)
    out = (grouped * rstd).view(M, N) * weight
    if bias is not None:
        out = out + bias
    if z is not None and norm_before_gate:
        out = out * F.silu(z)
    return out, rstd.squeeze(-1).t().reshape(-1)


def gated_rmsnorm_fwd(x, weight, bias, eps, z=None, out=None, group_size=None, norm_before_gate=True,
                      is_rms_norm=True):
    if not is_rms_norm:
        raise NotImplementedError("is_rms_norm=False: only the RMS variant is used by Mamba-2")
    y, rstd = _forward(x, weight, bias, eps, z, group_size, norm_before_gate)
    return y, None, rstd


def gated_rmsnorm_bwd(dy, x, weight, bias, eps, mean, rstd, z=None, group_size=None, norm_before_gate=True,
                      is_rms_norm=True):
    """Gradients (dx, dw, db, dz) by autograd through the forward (``mean``/``rstd`` are recomputed)."""
    if not is_rms_norm:
        raise NotImplementedError("is_rms_norm=False: only the RMS variant is used by Mamba-2")
    leaves = [t.detach().requires_grad_(True) if t is not None else None for t in (x, weight, bias, z)]
    with torch.enable_grad():
        y, _ = _forward(leaves[0], leaves[1], leaves[2], eps, leaves[3], group_size, norm_before_gate)
        wanted = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(y, wanted, dy))
    return tuple(next(grads) if t is not None else None for t in leaves)
