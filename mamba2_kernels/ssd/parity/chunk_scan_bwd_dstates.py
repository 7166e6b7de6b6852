"""Helion ``chunk_scan_bwd_dstates``: drop-in for mamba-ssm's ``_chunk_scan_bwd_dstates``
(``mamba2_kernels.ssd.parity``); the SSD backward runs it fused into
``mamba2_kernels.ssd.chunk_state_passing_bwd``, or, where the GPU's rule says so, as the first kernel of that
pass's chain (``mamba2_kernels.ssd.fused_paths``).

dstates[b,c,h,p,n] = sum_l exp(dA_cs[l]) dout[l,p] C[l,n] over the chunk's positions l (with seq_idx: only
those in the sequence of the position before the chunk): the gradient of the state entering chunk c from
that chunk's outputs. Returns (b, c, h, p, n) in ``dtype`` (default C.dtype).

One program per (batch, chunk, head, headdim block, dstate block), looping over the chunk in blocks:
(dout * decay)^T (p, k) @ C (k, n) on tensor cores in dout's dtype, fp32 accumulation.
Tunables: the headdim, dstate and chunk block sizes (mamba-ssm's 9-config GEMM list), warps, stages,
loop order, indexing.
Shape key: ``dtype`` (dout's), ``out`` (dstates'), ``headdim``, ``dstate``, ``chunk_size``, ``hpg``,
``seq`` (0/1), ``tokens`` = tokens_bucket(batch * seqlen).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import dtype_name, seq_prev, tokens


def _dstates_key(C, dA_cumsum, dout, seq_idx, prev_seq, dstates) -> ShapeKey:
    batch, seqlen, nheads, headdim = dout.shape
    return ShapeKey.of(dtype=dtype_name(dout.dtype), out=dtype_name(dstates.dtype), headdim=headdim,
                       dstate=C.shape[3], chunk_size=dA_cumsum.shape[3], hpg=nheads // C.shape[2],
                       seq=int(seq_idx is not None), tokens=tokens(batch, seqlen))


@tuned_kernel(name="chunk_scan_bwd_dstates", shape_key=_dstates_key, seeds=_seeds.matmul_mnk())
def chunk_scan_bwd_dstates_kernel(
    C: torch.Tensor,
    dA_cumsum: torch.Tensor,
    dout: torch.Tensor,
    seq_idx: torch.Tensor | None,
    prev_seq: torch.Tensor | None,
    dstates: torch.Tensor,
) -> None:
    batch, seqlen, nheads, headdim = dout.shape
    _, _, nchunks, chunk_size = dA_cumsum.shape
    ngroups = C.shape[2]
    dstate = C.shape[3]
    chunk_size = hl.specialize(chunk_size)
    ratio = nheads // ngroups
    block_m = hl.register_block_size(headdim)
    block_n = hl.register_block_size(dstate)
    block_k = hl.register_block_size(chunk_size)
    for tile_b, tile_c, tile_h, tile_m, tile_n in hl.tile(
        [batch, nchunks, nheads, headdim, dstate], block_size=[1, 1, 1, block_m, block_n]
    ):
        b = tile_b.begin
        c = tile_c.begin
        h = tile_h.begin
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(chunk_size, block_size=block_k):
            pos = c * chunk_size + tile_k.index
            valid = pos < seqlen
            scale = torch.exp(dA_cumsum[b, h, c, tile_k].to(torch.float32))
            if seq_idx is not None:
                s = hl.load(seq_idx, [b, pos], extra_mask=valid)
                scale = torch.where(s == prev_seq[b, c], scale, 0.0)
            do_k = hl.load(dout, [b, pos, h, tile_m], extra_mask=valid[:, None]).to(torch.float32)
            do_k = (do_k * scale[:, None]).to(dout.dtype)
            C_k = hl.load(C, [b, pos, h // ratio, tile_n], extra_mask=valid[:, None]).to(dout.dtype)
            acc = hl.dot(do_k.T, C_k, acc=acc)
        dstates[b, c, h, tile_m, tile_n] = acc.to(dstates.dtype)


def chunk_scan_bwd_dstates(C, dA_cumsum, dout, seq_idx=None, dtype=None):
    """Same arguments and result as mamba-ssm's ``_chunk_scan_bwd_dstates``: (b, c, h, p, n) in
    ``dtype`` (default C.dtype)."""
    batch, seqlen, nheads, headdim = dout.shape
    _, _, nchunks, chunk_size = dA_cumsum.shape
    assert C.shape[:2] == (batch, seqlen) and nheads % C.shape[2] == 0
    prev = None
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
        prev = seq_prev(seq_idx, chunk_size)
    dstates = torch.empty((batch, nchunks, nheads, headdim, C.shape[3]), device=C.device,
                          dtype=C.dtype if dtype is None else dtype)
    chunk_scan_bwd_dstates_kernel(C, dA_cumsum, dout, seq_idx, prev, dstates)
    return dstates
