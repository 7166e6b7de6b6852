"""Cheap exp and sigmoid for kernel bodies; exact in Helion's ref mode.

Helion lowers ``torch.exp`` to libdevice's correctly rounded ``expf`` (about eight SASS instructions) and
``torch.sigmoid`` to an IEEE-rounded division. ``torch.exp2`` lowers to one ``MUFU.EX2`` and ``torch.rsqrt``
to one ``MUFU.RSQ``, so these forms cost two or three instructions and stay within a few fp32 ulp: what
mamba-ssm's ``tl.exp`` does. A kernel uses them where they measured faster on the H200 (the conv, the
decay matrices of chunk_scan, chunk_state, dCB and ddA); the dx and dz kernels ran slower with them and
keep the exact forms (README, "exp2 and rsqrt in the hot loops").
"""

from __future__ import annotations

import torch

LOG2E = 1.4426950408889634


def exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp2(x * LOG2E)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    # 1 / (1 + e) as rsqrt(1 + e)^2: 1 + e >= 1, so rsqrt never meets a subnormal, zero or negative operand,
    # and e = inf (x very negative) gives 0 as it should.
    return torch.rsqrt(1.0 + exp(-x)) ** 2
