"""Helion ``chunk_scan_bwd_ddAcs_stable``: drop-in for mamba-ssm's ``_chunk_scan_bwd_ddAcs_stable``, for
parity timing only (``mamba2_kernels.ssd.parity``); the SSD backward gets the same intra-chunk ddA from the dCB stage
(``mamba2_kernels.ssd.chunk_scan_bwd.chunk_scan_bwd_dcb`` with ``CB=``), which has the products in hand.

ddA[t] = sum over l >= t > s of W[l, s], W[l, s] = (dout[l] . x[s]) CB[l, s] exp(dA_cs[l] - dA_cs[s]) dt[s]
for l > s: the gradient of dA_cumsum through the intra-chunk decay. Returns (b, h, c, Q) fp32.

One program per (batch, chunk, head, row block) walks the column blocks left of its diagonal in order, each
row block's column sums a partial summed on the host (deterministic, no atomics). chunk_size: a power of two.
Tunables: the row, column and headdim block sizes (mamba-ssm's autotune list), warps, stages.
Shape key: ``dtype`` (x's), ``headdim``, ``chunk_size``, ``hpg``, ``tokens`` = tokens_bucket(batch * seqlen).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels import _fastmath as fastmath
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import check_power_of_two_chunk, dtype_name, sum_partials, tokens


def _ddacs_key(x, dt, dA_cumsum, dout, cb) -> ShapeKey:
    batch, seqlen, nheads, headdim = x.shape
    return ShapeKey.of(dtype=dtype_name(x.dtype), headdim=headdim, chunk_size=dA_cumsum.shape[3],
                       hpg=nheads // cb.shape[2], tokens=tokens(batch, seqlen))


@tuned_kernel(name="chunk_scan_bwd_ddAcs_stable", shape_key=_ddacs_key, partial_sums={0: 3},
              seeds=_seeds.tiles_ddacs())
def chunk_scan_bwd_ddAcs_stable_kernel(
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    dout: torch.Tensor,
    cb: torch.Tensor,
) -> torch.Tensor:
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dA_cumsum.shape
    ngroups = cb.size(2)
    chunk_size = hl.specialize(chunk_size)
    ratio = nheads // ngroups
    block_m = hl.register_block_size(chunk_size)
    block_n = hl.register_block_size(chunk_size)
    block_k = hl.register_block_size(headdim)
    # One program per block of rows l, as mamba-ssm: with one program per chunk and a whole-chunk column
    # tile (256 wide at chunk 256) it ran 4x slower than mamba-ssm there. Each row block's column sums are
    # a partial, summed on the host.
    ddA = torch.empty([batch, nheads, nchunks, (chunk_size + block_m - 1) // block_m, chunk_size],
                      dtype=torch.float32, device=x.device)
    for tile_b, tile_c, tile_h, tile_m in hl.tile([batch, nchunks, nheads, chunk_size],
                                                  block_size=[1, 1, 1, block_m]):
        b = tile_b.begin
        c = tile_c.begin
        h = tile_h.begin
        pos_m = c * chunk_size + tile_m.index
        valid_m = pos_m < seqlen
        dA_m = dA_cumsum[b, h, c, tile_m].to(torch.float32)
        rowsum = hl.zeros([tile_m], dtype=torch.float32)  # sum of M[l, s'] over the columns done so far
        last = (tile_m.id + 1) * block_m  # columns s >= last have no row l > s in this block
        for tile_n in hl.tile(0, last, block_size=block_n):  # columns s, in order
            pos_n = c * chunk_size + tile_n.index
            valid_n = pos_n < seqlen
            m = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(headdim, block_size=block_k):
                do_k = hl.load(dout, [b, pos_m, h, tile_k], extra_mask=valid_m[:, None]).to(x.dtype)
                x_k = hl.load(x, [b, pos_n, h, tile_k], extra_mask=valid_n[:, None])
                m = hl.dot(do_k, x_k.T, acc=m)
            seg = dA_m[:, None] - dA_cumsum[b, h, c, tile_n].to(torch.float32)[None, :]
            m = m * cb[b, c, h // ratio, tile_m, tile_n].to(torch.float32)
            m = m * fastmath.exp(torch.where(seg < 0.0, seg, 0.0)) * dt[b, h, c, tile_n].to(torch.float32)[None, :]
            below = tile_m.index[:, None] > tile_n.index[None, :]
            m = torch.where(below, m, 0.0)
            # row prefix sums: cs[l, s] = sum_{s' <= s} M[l, s'] goes to ddA[s + 1] for rows l >= s + 1
            cs = torch.where(below, rowsum[:, None] + torch.cumsum(m, dim=1), 0.0)
            rowsum = rowsum + torch.sum(m, dim=1)
            hl.store(ddA, [b, h, c, tile_m.id, tile_n.index + 1], torch.sum(cs, dim=0),
                     extra_mask=tile_n.index + 1 < chunk_size)
            hl.store(ddA, [b, h, c, tile_m.id, tile_n.index], hl.zeros([tile_n], dtype=torch.float32),
                     extra_mask=tile_n.index == 0)
        for tile_z in hl.tile(last, chunk_size, block_size=block_n):
            ddA[b, h, c, tile_m.id, tile_z] = hl.zeros([tile_z], dtype=torch.float32)
    return ddA


def chunk_scan_bwd_ddAcs_stable(x, dt, dA_cumsum, dout, cb):
    """Same arguments and result as mamba-ssm's ``_chunk_scan_bwd_ddAcs_stable``: ddA (b, h, c, Q) fp32,
    the sum of the per-row-block partials."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    assert cb.shape == (batch, nchunks, cb.shape[2], chunk_size, chunk_size) and nheads % cb.shape[2] == 0
    check_power_of_two_chunk("chunk_scan_bwd_ddAcs_stable", chunk_size)
    part = chunk_scan_bwd_ddAcs_stable_kernel(x, dt, dA_cumsum, dout, cb)
    return sum_partials(part, 3)
