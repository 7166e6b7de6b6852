"""Drop-ins for mamba-ssm's ``rmsnorm_fn`` and ``RMSNorm`` (``mamba_ssm/ops/triton/layernorm_gated.py``),
backed by the Helion kernels of ``mamba2_kernels.norm.gated_rmsnorm``."""

from __future__ import annotations

import torch

from mamba2_kernels._ops import placed, present
from mamba2_kernels.norm.gated_rmsnorm import gated_rmsnorm_bwd, gated_rmsnorm_fwd

__all__ = ["rmsnorm_fn", "RMSNormGated"]


def _rows(t: torch.Tensor | None, features: int) -> torch.Tensor | None:
    """(..., features) -> (rows, features) with unit stride over the features, as the kernels read it."""
    if t is None:
        return None
    t = t.reshape(-1, features)
    return t if t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("mamba2_kernels::gated_rmsnorm_fwd", mutates_args=())
def _norm_fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None, eps: float,
                 group_size: int | None, norm_before_gate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd) over rows: one operator that torch.compile keeps whole."""
    y, _, rstd = gated_rmsnorm_fwd(x, weight, bias, eps, z=z, group_size=group_size,
                                   norm_before_gate=norm_before_gate)
    return y, rstd


@_norm_fwd_op.register_fake
def _norm_fwd_fake(x, weight, bias, z, eps, group_size, norm_before_gate):
    groups = x.shape[1] // (group_size or x.shape[1])
    return torch.empty_like(x), x.new_empty(groups * x.shape[0], dtype=torch.float32)


def _norm_setup_context(ctx, inputs, output):
    x, weight, bias, z, eps, group_size, norm_before_gate = inputs
    ctx.save_for_backward(x, weight, bias, output[1], z)
    ctx.eps, ctx.group_size, ctx.norm_before_gate = eps, group_size, norm_before_gate


def _norm_backward(ctx, dy, _drstd):
    x, weight, bias, rstd, z = ctx.saved_tensors
    dx, dw, *given = torch.ops.mamba2_kernels.gated_rmsnorm_bwd(
        _rows(dy, dy.shape[-1]), x, weight, bias, rstd, z, ctx.eps, ctx.group_size, ctx.norm_before_gate)
    db, dz = placed(given, (bias, z))
    return dx, dw, db, dz, None, None, None


_norm_fwd_op.register_autograd(_norm_backward, setup_context=_norm_setup_context)


@torch.library.custom_op("mamba2_kernels::gated_rmsnorm_bwd", mutates_args=())
def _norm_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 rstd: torch.Tensor, z: torch.Tensor | None, eps: float, group_size: int | None,
                 norm_before_gate: bool) -> list[torch.Tensor]:
    """[dx, dweight, then dbias and dz for those of bias and z given]."""
    dx, dw, db, dz = gated_rmsnorm_bwd(dy, x, weight, bias, eps, None, rstd, z, group_size, norm_before_gate)
    return [dx, dw, *present([db, dz])]


@_norm_bwd_op.register_fake
def _norm_bwd_fake(dy, x, weight, bias, rstd, z, eps, group_size, norm_before_gate):
    return [torch.empty_like(t) for t in present([x, weight, bias, z])]


def rmsnorm_fn(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """If z is not None: rmsnorm(x) * w * silu(z) when norm_before_gate, else rmsnorm(x * silu(z)) * w;
    over groups of ``group_size`` features (None: all of them). Any leading dims."""
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z: expected shape {tuple(x.shape)}, got {tuple(z.shape)}")
    features = x.shape[-1]
    y, _ = torch.ops.mamba2_kernels.gated_rmsnorm_fwd(
        _rows(x, features), weight.contiguous(), bias.contiguous() if bias is not None else None, _rows(z, features),
        float(eps), group_size, bool(norm_before_gate))
    return y.reshape(x.shape)


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
