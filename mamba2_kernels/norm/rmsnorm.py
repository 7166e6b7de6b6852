"""Drop-ins for mamba-ssm's ``rmsnorm_fn`` and ``RMSNorm`` (``mamba_ssm/ops/triton/layernorm_gated.py``),
backed by the Helion kernels of ``mamba2_kernels.norm.gated_rmsnorm``."""

from __future__ import annotations

import torch

from mamba2_kernels._runtime import eager_under_compile
from mamba2_kernels.norm.gated_rmsnorm import gated_rmsnorm_bwd, gated_rmsnorm_fwd

__all__ = ["GatedRMSNormFn", "rmsnorm_fn", "RMSNormGated"]


class GatedRMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        if x.stride(-1) != 1:
            x = x.contiguous()
        if z is not None:
            if z.shape != shape:
                raise ValueError(f"z: expected shape {tuple(shape)}, got {tuple(z.shape)}")
            z = z.reshape(-1, shape[-1])
            if z.stride(-1) != 1:
                z = z.contiguous()
        weight = weight.contiguous()
        bias = bias.contiguous() if bias is not None else None
        y, _, rstd = gated_rmsnorm_fwd(x, weight, bias, eps, z=z, group_size=group_size,
                                       norm_before_gate=norm_before_gate)
        ctx.save_for_backward(x, weight, bias, rstd, z)
        ctx.shape = shape
        ctx.eps = eps
        ctx.group_size = group_size
        ctx.norm_before_gate = norm_before_gate
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, rstd, z = ctx.saved_tensors
        dy = dy.reshape(-1, dy.shape[-1])
        if dy.stride(-1) != 1:
            dy = dy.contiguous()
        dx, dw, db, dz = gated_rmsnorm_bwd(dy, x, weight, bias, ctx.eps, None, rstd, z, ctx.group_size,
                                           ctx.norm_before_gate)
        dz = dz.reshape(ctx.shape) if dz is not None else None
        return dx.reshape(ctx.shape), dw, db, dz, None, None, None


@eager_under_compile
def rmsnorm_fn(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """If z is not None: rmsnorm(x) * w * silu(z) when norm_before_gate, else rmsnorm(x * silu(z)) * w;
    over groups of ``group_size`` features (None: all of them). Any leading dims."""
    return GatedRMSNormFn.apply(x, weight, bias, z, eps, group_size, norm_before_gate)


class RMSNormGated(torch.nn.Module):
    """mamba-ssm's ``layernorm_gated.RMSNorm`` (what ``Mamba2`` builds as ``RMSNormGated``)."""

    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.init.ones_(self.weight)

    def forward(self, x, z=None):
        return rmsnorm_fn(x, self.weight, self.bias, z=z, eps=self.eps, group_size=self.group_size,
                          norm_before_gate=self.norm_before_gate)
