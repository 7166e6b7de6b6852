"""Helion ``chunk_bwd_db_dc``: the gradients of B and C in one pass, where mamba-ssm launches four kernels
(``_chunk_state_bwd_db``, ``_chunk_scan_bwd_dC``, then ``_bmm_chunk_bwd`` twice) and ours chained three
(``mamba2_kernels.ssd.compose.chain_chunk_bwd_db_dc``: the db and dC kernels write fp32 partials that two
bmm_chunk_bwd launches read back as their residuals).

Within chunk c, with dA_cs the chunk's cumsum, Q the chunk size and dCB (b, c, g, Q, Q) the gradient of C B^T:
  dB[s, n] = sum_i dCB[i, s] C[i, n]
             + sum_h exp(min(dA_cs[Q-1] - dA_cs[s], 0)) dt[s] sum_p x[s, p] dstates[c][p, n]
  dC[l, n] = sum_s dCB[l, s] B[s, n] + sum_h exp(dA_cs[l]) sum_p dout[l, p] states[c][p, n]
(h over the heads of B's and C's group; with seq_idx the state terms count only positions in the sequence of
the chunk's last position (dB) and of the position before the chunk (dC)). The state terms' products with B
and C give the ddA terms the chain's db and dC kernels give, in the same forms: ddA_next, the exclusive cumsum
over the chunk of sum_n (dB's state term of head h)[s, n] B[s, n], and ddA_prev, sum_n (dC's of head h)[l, n]
C[l, n], each (b, h, c, Q) fp32, or as partials over dstate blocks (b, h, c, Q, k) for
``chunk_cumsum_bwd_of_terms``.

The twins run as one pass: one program per (batch, chunk, group, row block, dstate block) loops over the heads
of its group once, loading each head's dA_cs and dt rows once for both gradients, and writes dB and dC in
their dtypes directly, so the fp32 partials of the chain never reach memory. The price: no head splits (the
db and dC kernels' ``heads_per_program``), so a call with few groups and chunks has fewer programs; which path
a GPU runs at a shape is its file's rule (``mamba2_kernels.ssd.fused_paths``).

The dCB loop is bmm_chunk_bwd's and the per-head products are chunk_state_bwd_db's and chunk_scan_bwd_dC's
loops, written again: Helion cannot call a device loop defined in a helper (pytorch/helion#865).

Tunables: row, dstate, headdim and chunk (the dCB loop) block sizes, warps, stages, indexing.
Shape key: ``dtype`` (x's), ``headdim``, ``dstate``, ``chunk_size``, ``hpg`` (heads per group), ``seq``
(0/1), ``tokens`` = tokens_bucket(batch * seqlen).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels._buffers import check_out, empty_dense
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import dtype_name, exclusive_cumsum, seq_last, seq_prev, sum_partials, tokens


def _shape_key(x, dt, dA_cumsum, B, C, dout, states, dstates, dcb, seq_idx, last_seq, prev_seq, dB, dC, ngroups,
               hpg) -> ShapeKey:
    batch, seqlen, _, headdim = x.shape
    return ShapeKey.of(dtype=dtype_name(x.dtype), headdim=headdim, dstate=B.shape[3], chunk_size=dt.shape[3],
                       hpg=hpg, seq=int(seq_idx is not None), tokens=tokens(batch, seqlen))


@tuned_kernel(name="chunk_bwd_db_dc", shape_key=_shape_key, seeds=_seeds.tiles_db_dc())
def chunk_bwd_db_dc_kernel(
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dout: torch.Tensor,
    states: torch.Tensor,
    dstates: torch.Tensor,
    dcb: torch.Tensor,
    seq_idx: torch.Tensor | None,
    last_seq: torch.Tensor | None,
    prev_seq: torch.Tensor | None,
    dB: torch.Tensor,  # B's shape, written; may be strided (a slice of the layer's input gradient)
    dC: torch.Tensor,  # likewise C's
    ngroups: int,
    hpg: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    dstate = B.size(3)
    chunk_size = hl.specialize(chunk_size)
    block_m = hl.register_block_size(chunk_size)
    block_n = hl.register_block_size(dstate)
    block_k = hl.register_block_size(headdim)
    block_i = hl.register_block_size(chunk_size)
    nblocks_n = (dstate + block_n - 1) // block_n
    next_part = torch.empty([batch, nheads, nchunks, chunk_size, nblocks_n], dtype=torch.float32, device=x.device)
    prev_part = torch.empty([batch, nheads, nchunks, chunk_size, nblocks_n], dtype=torch.float32, device=x.device)
    for tile_b, tile_c, tile_g, tile_m, tile_n in hl.tile(
        [batch, nchunks, ngroups, chunk_size, dstate], block_size=[1, 1, 1, block_m, block_n]
    ):
        b = tile_b.begin
        c = tile_c.begin
        g = tile_g.begin
        pos = c * chunk_size + tile_m.index
        valid = pos < seqlen
        keep_next = valid
        keep_prev = valid
        if seq_idx is not None:
            s = hl.load(seq_idx, [b, pos], extra_mask=valid)
            keep_next = valid & (s == last_seq[b, c])
            keep_prev = valid & (s == prev_seq[b, c])
        B_m = hl.load(B, [b, pos, g, tile_n], extra_mask=valid[:, None]).to(torch.float32)
        C_m = hl.load(C, [b, pos, g, tile_n], extra_mask=valid[:, None]).to(torch.float32)
        # The intra-chunk terms, as bmm_chunk_bwd computes them: dCB in B's and C's dtype on tensor cores.
        acc_B = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        acc_C = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_i in hl.tile(chunk_size, block_size=block_i):
            pos_i = c * chunk_size + tile_i.index
            valid_i = pos_i < seqlen
            C_i = hl.load(C, [b, pos_i, g, tile_n], extra_mask=valid_i[:, None])
            B_i = hl.load(B, [b, pos_i, g, tile_n], extra_mask=valid_i[:, None])
            acc_B = hl.dot(dcb[b, c, g, tile_i, tile_m].to(C.dtype).T, C_i, acc=acc_B)
            acc_C = hl.dot(dcb[b, c, g, tile_m, tile_i].to(B.dtype), B_i, acc=acc_C)
        # The state terms, head by head.
        for hi in hl.grid(hpg):
            h = g * hpg + hi
            state_B = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            state_C = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(headdim, block_size=block_k):
                x_k = hl.load(x, [b, pos, h, tile_k], extra_mask=valid[:, None])
                do_k = hl.load(dout, [b, pos, h, tile_k], extra_mask=valid[:, None])
                state_B = hl.dot(x_k, dstates[b, c, h, tile_k, tile_n].to(x.dtype), acc=state_B)
                state_C = hl.dot(do_k, states[b, c, h, tile_k, tile_n].to(dout.dtype), acc=state_C)
            dA_m = dA_cumsum[b, h, c, tile_m].to(torch.float32)
            seg = dA_cumsum[b, h, c, chunk_size - 1].to(torch.float32) - dA_m
            scale_B = torch.exp(torch.where(seg < 0.0, seg, 0.0)) * dt[b, h, c, tile_m].to(torch.float32)
            state_B = state_B * torch.where(keep_next, scale_B, 0.0)[:, None]
            state_C = state_C * torch.where(keep_prev, torch.exp(dA_m), 0.0)[:, None]
            acc_B = acc_B + state_B
            acc_C = acc_C + state_C
            next_part[b, h, c, tile_m, tile_n.id] = torch.sum(state_B * B_m, dim=1)
            prev_part[b, h, c, tile_m, tile_n.id] = torch.sum(state_C * C_m, dim=1)
        hl.store(dB, [b, pos, g, tile_n], acc_B.to(dB.dtype), extra_mask=valid[:, None])
        hl.store(dC, [b, pos, g, tile_n], acc_C.to(dC.dtype), extra_mask=valid[:, None])
    return next_part, prev_part


def chunk_bwd_db_dc(x, dt, dA_cumsum, B, C, dout, states, dstates, dcb, seq_idx=None, dB=None, dC=None,
                    unfinished=False):
    """dB and dC (B's and C's shape and dtype, or the given buffers, filled and returned), ddA_next and
    ddA_prev: the results of ``mamba2_kernels.ssd.naive.chunk_bwd_db_dc``. ``states``: the states entering each
    chunk (b, c, h, p, n); ``dstates``: the gradient of the states leaving it; ``dcb``: the gradient of C B^T
    (b, c, g, Q, Q) fp32. ``unfinished``: ddA_next and ddA_prev as partials over dstate blocks (b, h, c, Q, k),
    for ``chunk_cumsum_bwd_of_terms``."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    if nheads % ngroups or C.shape != B.shape or B.shape[:2] != (batch, seqlen):
        raise ValueError(f"B, C: expected ({batch}, {seqlen}, ngroups dividing {nheads}, dstate) each, got "
                         f"{tuple(B.shape)} and {tuple(C.shape)}")
    assert dout.shape == x.shape and dA_cumsum.shape == dt.shape == (batch, nheads, nchunks, chunk_size)
    assert states.shape == dstates.shape == (batch, nchunks, nheads, headdim, dstate)
    assert dcb.shape == (batch, nchunks, ngroups, chunk_size, chunk_size)
    check_out("dB", dB, B.shape, B.dtype)
    check_out("dC", dC, C.shape, C.dtype)
    last = prev = None
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
        last, prev = seq_last(seq_idx, chunk_size), seq_prev(seq_idx, chunk_size)
    dB = empty_dense(B) if dB is None else dB
    dC = empty_dense(C) if dC is None else dC
    next_part, prev_part = chunk_bwd_db_dc_kernel(x, dt, dA_cumsum, B, C, dout, states, dstates, dcb, seq_idx, last,
                                                  prev, dB, dC, int(ngroups), nheads // ngroups)
    if unfinished:
        return dB, dC, next_part, prev_part
    return dB, dC, exclusive_cumsum(sum_partials(next_part, -1)), sum_partials(prev_part, -1)
