"""Helion ``chunk_cumsum_fwd``: drop-in for mamba-ssm's ``_chunk_cumsum_fwd``.

dt (b, L, h) -> dA_cumsum, dt_out (b, h, c, Q), fp32. dt_out = clamp(softplus?(dt + dt_bias), dt_limit),
0 at padded positions of the last chunk; dA_cumsum is the within-chunk cumulative sum of dt_out * A.

One program per (batch, chunk, block of heads); the whole chunk is one tile (a scan along it). The kernel
reads dt through a (b, h, L) view, so that its tiles are (heads, positions) like the outputs: the scan runs
along a tile's rows and the stores need no transpose (measured faster on the H200 than (positions, heads)
tiles, docs/kernels.md).
Tunables: the head block size (mamba-ssm's BLOCK_SIZE_H autotune list), warps, stages, indexing.
Shape key (``mamba2_kernels/configs/<gpu>.yaml``): ``dtype`` (dt's), ``nheads``, ``chunk_size``, ``bias``
(0/1), ``softplus`` (0/1), ``tokens`` = tokens_bucket(batch * seqlen).
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._dt import processed_dt
from mamba2_kernels.ssd._keys import dtype_name, tokens


def _shape_key(dt_hl, A, dt_bias, chunk_size, dt_softplus, dt_min, dt_max) -> ShapeKey:
    batch, nheads, seqlen = dt_hl.shape
    return ShapeKey.of(dtype=dtype_name(dt_hl.dtype), nheads=nheads, chunk_size=chunk_size,
                       bias=int(dt_bias is not None), softplus=int(bool(dt_softplus)),
                       tokens=tokens(batch, seqlen))


@tuned_kernel(name="chunk_cumsum", shape_key=_shape_key, seeds=_seeds.rows(_seeds.HEAD_BLOCKS))
def chunk_cumsum_kernel(
    dt_hl: torch.Tensor,  # dt as a (b, h, L) view: each head's positions along a tile's rows
    A: torch.Tensor,
    dt_bias: torch.Tensor | None,
    chunk_size: hl.constexpr,
    dt_softplus: hl.constexpr,
    dt_min: float,
    dt_max: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, nheads, seqlen = dt_hl.shape
    nchunks = (seqlen + chunk_size - 1) // chunk_size
    dA_cumsum = torch.empty([batch, nheads, nchunks, chunk_size], dtype=torch.float32, device=dt_hl.device)
    dt_out = torch.empty([batch, nheads, nchunks, chunk_size], dtype=torch.float32, device=dt_hl.device)
    block_h = hl.register_block_size(nheads)
    block_q = helion.next_power_of_2(chunk_size)
    for tile_b, tile_c, tile_h in hl.tile([batch, nchunks, nheads], block_size=[1, 1, block_h]):
        for tile_q in hl.tile(chunk_size, block_size=block_q):
            pos = tile_c.begin * chunk_size + tile_q.index
            valid = pos < seqlen
            d = hl.load(dt_hl, [tile_b.begin, tile_h, pos], extra_mask=valid[None, :]).to(torch.float32)
            if dt_bias is not None:
                d = d + dt_bias[tile_h].to(torch.float32)[:, None]
            d = processed_dt(d, dt_softplus, dt_min, dt_max, valid[None, :])
            dt_out[tile_b.begin, tile_h, tile_c.begin, tile_q] = d
            dA_cumsum[tile_b.begin, tile_h, tile_c.begin, tile_q] = torch.cumsum(
                d * A[tile_h].to(torch.float32)[:, None], dim=1)
    return dA_cumsum, dt_out


def chunk_cumsum_fwd(dt, A, chunk_size, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """Same arguments and results as mamba-ssm's ``_chunk_cumsum_fwd``."""
    batch, seqlen, nheads = dt.shape
    assert A.shape == (nheads,)
    if dt_bias is not None:
        assert dt_bias.shape == (nheads,)
    return chunk_cumsum_kernel(dt.transpose(1, 2), A, dt_bias, int(chunk_size), bool(dt_softplus),
                               float(dt_limit[0]), float(dt_limit[1]))
