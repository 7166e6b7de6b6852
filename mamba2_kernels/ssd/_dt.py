"""dt as chunk_cumsum makes it, for the kernel bodies that make it themselves (chunk_cumsum and the state pass
with the cumsum fused in): a plain function of tensors, which Helion traces inline."""

from __future__ import annotations

import torch

from mamba2_kernels import _fastmath as fastmath


def processed_dt(d: torch.Tensor, softplus: bool, dt_min: float, dt_max: float, valid: torch.Tensor) -> torch.Tensor:
    """clamp(softplus?(d), dt_min, dt_max), 0 where not ``valid`` (past seqlen; it broadcasts against ``d``), for d
    = the call's dt + dt_bias in fp32 (a caller adds the bias: a conditional expression over a None tensor does not
    compile)."""
    if softplus:
        d = fastmath.softplus(d)
    d = torch.where(d < dt_min, dt_min, d)
    d = torch.where(d > dt_max, dt_max, d)
    return torch.where(valid, d, 0.0)

