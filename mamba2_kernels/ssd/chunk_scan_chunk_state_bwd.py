"""Helion ``chunk_scan_chunk_state_bwd_dx``: drop-in for mamba-ssm's ``_chunk_scan_chunk_state_bwd_dx``
(ssd_combined.py), the gradient of x through chunk_state and chunk_scan together.

acc[l, p] = exp(min(dA_cs[last] - dA_cs[l], 0)) B[l] . dstates[c][p] (with seq_idx: only l in the
sequence of the chunk's last position) + sum_{s >= l} CB[s, l] exp(min(dA_cs[s] - dA_cs[l], 0)) dout[s, p].
Returns dx = acc dt + D dout (x.dtype), ddt (b, h, c, Q) fp32 = sum_p acc x, dD (D's shape and dtype,
None without D) = sum dout x.

One program per (batch, chunk, head, row block, headdim block): B @ dstates^T over dstate blocks, then
the anti-causal loop over column blocks from the diagonal block to the chunk's end, on tensor cores in
x's dtype with fp32 accumulation. ddt and dD are per-program partial sums (over headdim blocks, and over
row blocks / chunks) added on the host: deterministic, no atomics, no zero-fill.
Tunables: row, headdim, column and dstate block sizes, warps, stages, indexing.
Shape key: ``dtype`` (x's), ``headdim``, ``dstate``, ``chunk_size``, ``hpg``, ``D`` (none / h / hp),
``seq`` (0/1), ``tokens`` = tokens_bucket(batch * seqlen).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels._buffers import check_out, empty_dense
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import (
    check_power_of_two_chunk,
    d_kind_of,
    dtype_name,
    seq_last,
    sum_partials,
    tokens,
)


def _shape_key(x, dt, dA_cumsum, B, CB, dout, dstates, D, seq_idx, last_seq, dx, d_kind) -> ShapeKey:
    batch, seqlen, nheads, headdim = x.shape
    return ShapeKey.of(dtype=dtype_name(x.dtype), headdim=headdim, dstate=B.shape[3], chunk_size=dt.shape[3],
                       hpg=nheads // B.shape[2], D=("none", "h", "hp")[d_kind], seq=int(seq_idx is not None),
                       tokens=tokens(batch, seqlen))


@tuned_kernel(name="chunk_scan_chunk_state_bwd_dx", shape_key=_shape_key, partial_sums={1: 0, 2: 3},
              seeds=[*_seeds.matmul_mnkk(), _seeds.SWEPT_DX])
def chunk_scan_chunk_state_bwd_dx_kernel(
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    B: torch.Tensor,
    CB: torch.Tensor,
    dout: torch.Tensor,
    dstates: torch.Tensor,
    D: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    last_seq: torch.Tensor | None,
    dx: torch.Tensor,  # x's shape, written; may be strided (a slice of the layer's xBC gradient)
    d_kind: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    ngroups = B.shape[2]
    dstate = B.shape[3]
    chunk_size = hl.specialize(chunk_size)
    ratio = nheads // ngroups
    block_m = hl.register_block_size(chunk_size)
    block_n = hl.register_block_size(headdim)
    block_k = hl.register_block_size(chunk_size)
    block_s = hl.register_block_size(dstate)
    nblocks_m = (chunk_size + block_m - 1) // block_m
    nblocks_n = (headdim + block_n - 1) // block_n
    ddt_part = torch.empty([nblocks_n, batch, nheads, nchunks, chunk_size], dtype=torch.float32, device=x.device)
    dD_part = torch.empty([batch, nchunks, nheads, nblocks_m, headdim] if D is not None else [0, 0, 0, 0, 0],
                          dtype=torch.float32, device=x.device)
    for tile_b, tile_c, tile_h, tile_m, tile_n in hl.tile(
        [batch, nchunks, nheads, chunk_size, headdim], block_size=[1, 1, 1, block_m, block_n]
    ):
        b = tile_b.begin
        c = tile_c.begin
        h = tile_h.begin
        g = h // ratio
        pos_m = c * chunk_size + tile_m.index
        valid_m = pos_m < seqlen
        dA_m = dA_cumsum[b, h, c, tile_m].to(torch.float32)
        dA_last = dA_cumsum[b, h, c, chunk_size - 1].to(torch.float32)
        # Through chunk_state: B[l] . dstates[c], decayed from l to the chunk's end.
        acc_s = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_s in hl.tile(dstate, block_size=block_s):
            B_s = hl.load(B, [b, pos_m, g, tile_s], extra_mask=valid_m[:, None]).to(x.dtype)
            ds = dstates[b, c, h, tile_n, tile_s].to(x.dtype)
            acc_s = hl.dot(B_s, ds.T, acc=acc_s)
        seg_last = dA_last - dA_m
        scale_m = torch.exp(torch.where(seg_last < 0.0, seg_last, 0.0))
        if seq_idx is not None:
            s_m = hl.load(seq_idx, [b, pos_m], extra_mask=valid_m)
            scale_m = torch.where(s_m == last_seq[b, c], scale_m, 0.0)
        acc = acc_s * scale_m[:, None]
        # Through chunk_scan's intra-chunk part: later positions s >= l of the chunk.
        for tile_k in hl.tile(tile_m.id * block_m, chunk_size, block_size=block_k):
            pos_k = c * chunk_size + tile_k.index
            valid_k = pos_k < seqlen
            w = CB[b, c, g, tile_k, tile_m].to(torch.float32)  # (k, m): CB[s, l]
            seg = dA_cumsum[b, h, c, tile_k].to(torch.float32)[:, None] - dA_m[None, :]
            w = w * torch.exp(torch.where(seg < 0.0, seg, 0.0))
            w = torch.where(tile_k.index[:, None] >= tile_m.index[None, :], w, 0.0).to(dout.dtype)
            do_k = hl.load(dout, [b, pos_k, h, tile_n], extra_mask=valid_k[:, None])
            acc = hl.dot(w.T, do_k, acc=acc)
        x_m = hl.load(x, [b, pos_m, h, tile_n], extra_mask=valid_m[:, None]).to(torch.float32)
        ddt_part[tile_n.id, b, h, c, tile_m] = torch.sum(acc * x_m, dim=1)
        dx_m = acc * dt[b, h, c, tile_m].to(torch.float32)[:, None]
        if D is not None:
            do_m = hl.load(dout, [b, pos_m, h, tile_n], extra_mask=valid_m[:, None]).to(torch.float32)
            if d_kind == 2:
                dx_m = dx_m + do_m * D[h, tile_n].to(torch.float32)[None, :]
            else:
                dx_m = dx_m + do_m * D[h].to(torch.float32)
            dD_part[b, c, h, tile_m.id, tile_n] = torch.sum(do_m * x_m, dim=0)
        hl.store(dx, [b, pos_m, h, tile_n], dx_m.to(dx.dtype), extra_mask=valid_m[:, None])
    return dx, ddt_part, dD_part


def chunk_scan_chunk_state_bwd_dx(x, dt, dA_cumsum, B, CB, dout, dstates, D=None, seq_idx=None, dx=None):
    """Same arguments and results as mamba-ssm's ``_chunk_scan_chunk_state_bwd_dx``: (dx, ddt, dD).
    A given ``dx`` (x's shape and dtype, any strides) is filled by the kernel and returned."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    ngroups = B.shape[2]
    assert nheads % ngroups == 0 and B.shape[:2] == (batch, seqlen)
    assert CB.shape == (batch, nchunks, ngroups, chunk_size, chunk_size)
    assert dstates.shape == (batch, nchunks, nheads, headdim, B.shape[3])
    assert dout.shape == x.shape
    check_out("dx", dx, x.shape, x.dtype)
    check_power_of_two_chunk("chunk_scan_chunk_state_bwd_dx", chunk_size)
    d_kind = d_kind_of(D, nheads, headdim)
    last = None
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
        last = seq_last(seq_idx, chunk_size)
    dx, ddt_part, dD_part = chunk_scan_chunk_state_bwd_dx_kernel(
        x, dt, dA_cumsum, B, CB, dout, dstates, D, seq_idx, last, empty_dense(x) if dx is None else dx, d_kind)
    ddt = sum_partials(ddt_part, 0)
    dD = None
    if D is not None:
        dD = dD_part.sum(dim=(0, 1, 3))
        dD = (dD.sum(-1) if d_kind == 1 else dD).to(D.dtype)
    return dx, ddt, dD
