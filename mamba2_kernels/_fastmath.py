"""Cheap exp and sigmoid for kernel bodies; exact in Helion's ref mode.

Helion lowers ``torch.exp`` to libdevice's correctly rounded ``expf`` (about eight SASS instructions) and
``torch.sigmoid`` to an IEEE-rounded division. ``torch.exp2`` lowers to one ``MUFU.EX2`` and ``torch.rsqrt``
to one ``MUFU.RSQ``, so these forms cost two or three instructions and stay within a few fp32 ulp: what
mamba-ssm's ``tl.exp`` does. A kernel uses them where they measured faster on the H200 (the conv, the
decay matrices of chunk_scan, chunk_state, dCB and ddA); the dx and dz kernels ran slower with them and
keep the exact forms (docs/kernels.md, "exp2 and rsqrt in the hot loops").
"""

from __future__ import annotations

import torch

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
SOFTPLUS_THRESHOLD = 20.0  # identity above it, as mamba-ssm and torch.nn.functional.softplus's default


def exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp2(x * LOG2E)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    # 1 / (1 + e) as rsqrt(1 + e)^2: 1 + e >= 1, so rsqrt never meets a subnormal, zero or negative operand,
    # and e = inf (x very negative) gives 0 as it should.
    return torch.rsqrt(1.0 + exp(-x)) ** 2


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x), x itself above the threshold. Below -5 by the series of log1p(u) to u^3 (relative error
    under 1e-7 there, where 1 + u would round away most of u; Triton's interpreter has no log1p)."""
    u = exp(x)
    series = u * (1.0 - u * (0.5 - u * (1.0 / 3.0)))
    return torch.where(x <= SOFTPLUS_THRESHOLD, torch.where(x < -5.0, series, torch.log2(1.0 + u) * LN2), x)
