"""Helion SSD forward after chunk_cumsum in one launch: chunk_state, state passing, bmm_chunk and chunk_scan, four
of the five kernels of mamba-ssm's combined forward (one launch on the chained path here does the first two,
another the last two).

Math, per batch b, head h (group g) and chunk c of Q positions, from chunk_cumsum's dt_out and dA = dA_cumsum:
  chunk_state(c) = x_c^T (B_c * exp(dA[Q-1] - dA) * dt_out)        (B scaled and rounded to x's dtype)
  S(c + 1) = exp(dA[Q-1]) S(c) + chunk_state(c),  S(0) = initial_states or 0              (fp32 throughout)
  y[l] = exp(dA[l]) C[l] . S(c) + sum_{s <= l} (C[l] . B[s]) exp(dA[l] - dA[s]) dt_out[s] x[s] + D x[l]
  out = y * silu(z) and out_x = y with z, else out = y;  final_states = S(nchunks)
S(c) enters C[l] . S(c) rounded to C's dtype, as chunk_scan reads the stored states, so ``state_dtype`` does not
change the outputs. With seq_idx, as the chained kernels: a chunk's positions outside the sequence of its last
position add nothing to its state, the carry is dropped where it crosses a sequence boundary, C[l] . S(c) counts
only where l is in the sequence of the position before the chunk, and C[l] . B[s] only within one sequence.

Why one launch: the chained forward writes the per-chunk states (b, c, h, p, n) and reads them back, and reads x
twice. Here one program per (batch, head, headdim block) walks the chunks in order, as the chained state pass
does, carrying S(c) in registers: at each chunk it makes the chunk's outputs from S(c), then S(c + 1) from the
chunk's state product. No state leaves the program but the final one, and x, B and C are read from memory once.
The walk needs no hand-over between programs (an earlier version, one program per chunk, handed the state on
through a spin on a counter in memory: serial, and slower than the chain). The price is parallelism: batch x
heads x headdim blocks programs, each walking every chunk, so a call with few heads leaves SMs idle; the config
file's rule (``selection.ssd_fused_fwd.fuse``) keeps the chain where that loses.

dt's cumsum stays a launch of its own (``chunk_cumsum``), which the walk then reads: made inside, the row and
column loops would need its elements at their own positions, which a register vector cannot give them. Inputs
come as (b, c, Q, ...) views (``by_chunk``: a zero-padded copy when the chunk size does not divide seqlen); the
outputs are written in place, masked past seqlen.

Tunables: the headdim block, the chunk block of the state product, the row and column blocks of the outputs,
warps, stages, loop order, indexing. The state dimension is one block (C[l] . S(c) needs all of it).
Shape key: ``dtype`` (x's), ``headdim``, ``dstate``, ``chunk_size``, ``hpg``, ``D`` (none / h / hp), ``z``,
``seq``, ``init`` (0/1), ``tokens`` = tokens_bucket(batch * nchunks * chunk_size).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels import _fastmath as fastmath
from mamba2_kernels._buffers import empty_dense
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import (
    by_chunk,
    carry_decay_log,
    check_power_of_two_chunk,
    d_kind_of,
    dtype_name,
    seq_last,
    seq_prev,
    tokens,
)


def _shape_key(x, dt, dA_cumsum, dA_chunk, B, C, D, z, seq_idx, last_seq, prev_seq, initial_states, out, out_x,
               final_states, d_kind) -> ShapeKey:
    batch, nchunks, chunk_size, nheads, headdim = x.shape
    return ShapeKey.of(dtype=dtype_name(x.dtype), headdim=headdim, dstate=B.shape[4], chunk_size=chunk_size,
                       hpg=nheads // B.shape[3], D=("none", "h", "hp")[d_kind], z=int(z is not None),
                       seq=int(seq_idx is not None), init=int(initial_states is not None),
                       tokens=tokens(batch, nchunks * chunk_size))


@tuned_kernel(name="ssd_fused_fwd", shape_key=_shape_key, seeds=_seeds.ssd_fused_fwd())
def ssd_fused_fwd_kernel(
    x: torch.Tensor,  # (b, c, Q, h, p): by_chunk views
    dt: torch.Tensor,  # (b, h, c, Q) fp32: chunk_cumsum's dt_out
    dA_cumsum: torch.Tensor,  # (b, h, c, Q) fp32
    dA_chunk: torch.Tensor,  # (b, h, c): dA_cumsum[..., -1], -inf where the carry is dropped
    B: torch.Tensor,  # (b, c, Q, g, n)
    C: torch.Tensor,  # (b, c, Q, g, n)
    D: torch.Tensor | None,  # (h,) or (h, p)
    z: torch.Tensor | None,  # (b, c, Q, h, p)
    seq_idx: torch.Tensor | None,  # (b, c, Q)
    last_seq: torch.Tensor | None,  # (b, c): seq_idx at each chunk's last valid position
    prev_seq: torch.Tensor | None,  # (b, c): seq_idx at the position before each chunk
    initial_states: torch.Tensor | None,  # (b, h, p, n)
    out: torch.Tensor,  # (b, L, h, p)
    out_x: torch.Tensor | None,
    final_states: torch.Tensor,  # (b, h, p, n) fp32
    d_kind: hl.constexpr,
) -> None:
    batch, nchunks, chunk_size, nheads, headdim = x.shape
    seqlen = out.shape[1]
    chunk_size = hl.specialize(chunk_size)
    dstate = hl.specialize(B.shape[4])
    ratio = nheads // B.shape[3]
    block_p = hl.register_block_size(headdim)
    block_q = hl.register_block_size(chunk_size)
    block_m = hl.register_block_size(chunk_size)
    block_k = hl.register_block_size(chunk_size)
    for tile_b, tile_h, tile_p in hl.tile([batch, nheads, headdim], block_size=[1, 1, block_p]):
        b = tile_b.begin
        h = tile_h.begin
        g = h // ratio
        state = hl.zeros([tile_p, dstate], dtype=torch.float32)
        if initial_states is not None:
            state = initial_states[b, h, tile_p, :].to(torch.float32)
        for tile_c in hl.tile(nchunks, block_size=1):
            c = tile_c.begin
            # The outputs, from S(c), rounded as chunk_scan reads the stored states.
            state_in = state.to(C.dtype)
            for tile_m in hl.tile(chunk_size, block_size=block_m):
                C_m = C[b, c, tile_m, g, :]
                dA_m = dA_cumsum[b, h, c, tile_m]
                scale_m = fastmath.exp(dA_m)
                if seq_idx is not None:
                    s_m = seq_idx[b, c, tile_m]
                    scale_m = torch.where(s_m == prev_seq[b, c], scale_m, 0.0)
                acc = hl.dot(C_m, state_in.T, out_dtype=torch.float32) * scale_m[:, None]
                for tile_k in hl.tile(0, (tile_m.id + 1) * block_m, block_size=block_k):
                    w = hl.dot(C_m, B[b, c, tile_k, g, :].T, out_dtype=torch.float32)
                    if seq_idx is not None:
                        w = torch.where(s_m[:, None] == seq_idx[b, c, tile_k][None, :], w, 0.0)
                    seg = dA_m[:, None] - dA_cumsum[b, h, c, tile_k][None, :]
                    w = w * fastmath.exp(torch.where(seg < 0.0, seg, 0.0))
                    w = w * dt[b, h, c, tile_k][None, :]
                    w = torch.where(tile_m.index[:, None] >= tile_k.index[None, :], w, 0.0).to(x.dtype)
                    acc = hl.dot(w, x[b, c, tile_k, h, tile_p], acc=acc)
                if D is not None:
                    x_m = x[b, c, tile_m, h, tile_p].to(torch.float32)
                    if d_kind == 2:
                        acc = acc + x_m * D[h, tile_p].to(torch.float32)[None, :]
                    else:
                        acc = acc + x_m * D[h].to(torch.float32)
                pos_m = c * chunk_size + tile_m.index
                valid_m = pos_m < seqlen
                if out_x is not None:
                    hl.store(out_x, [b, pos_m, h, tile_p], acc.to(out.dtype), extra_mask=valid_m[:, None])
                    z_m = z[b, c, tile_m, h, tile_p].to(torch.float32)
                    acc = acc * z_m * torch.sigmoid(z_m)
                hl.store(out, [b, pos_m, h, tile_p], acc.to(out.dtype), extra_mask=valid_m[:, None])
            # S(c + 1) = exp(dA[Q-1]) S(c) + chunk_state(c).
            dA_last = dA_cumsum[b, h, c, chunk_size - 1]
            chunk_state = hl.zeros([tile_p, dstate], dtype=torch.float32)
            for tile_q in hl.tile(chunk_size, block_size=block_q):
                seg = dA_last - dA_cumsum[b, h, c, tile_q]
                scale = fastmath.exp(torch.where(seg < 0.0, seg, 0.0)) * dt[b, h, c, tile_q]
                if seq_idx is not None:
                    scale = torch.where(seq_idx[b, c, tile_q] == last_seq[b, c], scale, 0.0)
                B_scaled = (B[b, c, tile_q, g, :].to(torch.float32) * scale[:, None]).to(x.dtype)
                chunk_state = hl.dot(x[b, c, tile_q, h, tile_p].T, B_scaled, acc=chunk_state)
            state = torch.exp(dA_chunk[b, h, c]) * state + chunk_state
        final_states[b, h, tile_p, :] = state


def ssd_fused_fwd(x, dt, dA_cumsum, B, C, D=None, z=None, initial_states=None, seq_idx=None):
    """``chunk_state_passing_fwd`` then ``bmm_chunk_scan_fwd`` in one launch, on chunk_cumsum's dt_out ``dt`` and
    ``dA_cumsum`` (b, h, c, Q) fp32. Returns (out, out_x or None, final_states (b, h, p, n) fp32). It writes no
    per-chunk states: the forward's caller keeps none (varlen states need them, and take the chained path)."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    chunk_size = dt.shape[3]
    assert nheads % ngroups == 0 and B.shape == C.shape and B.shape[:2] == (batch, seqlen)
    assert dA_cumsum.shape == dt.shape == (batch, nheads, -(-seqlen // chunk_size), chunk_size)
    assert initial_states is None or initial_states.shape == (batch, nheads, headdim, dstate)
    assert seq_idx is None or seq_idx.shape == (batch, seqlen)
    assert z is None or z.shape == x.shape
    check_power_of_two_chunk("ssd_fused_fwd", chunk_size)
    d_kind = d_kind_of(D, nheads, headdim)
    out = empty_dense(x)
    out_x = empty_dense(x) if z is not None else None
    final_states = torch.empty((batch, nheads, headdim, dstate), device=x.device, dtype=torch.float32)
    last = prev = chunked_seq = None
    if seq_idx is not None:
        last, prev, chunked_seq = seq_last(seq_idx, chunk_size), seq_prev(seq_idx, chunk_size), by_chunk(seq_idx,
                                                                                                          chunk_size)
    ssd_fused_fwd_kernel(by_chunk(x, chunk_size), dt, dA_cumsum,
                         carry_decay_log(dA_cumsum[:, :, :, -1], seq_idx, chunk_size), by_chunk(B, chunk_size),
                         by_chunk(C, chunk_size), D, None if z is None else by_chunk(z, chunk_size), chunked_seq, last,
                         prev, initial_states, out, out_x, final_states, d_kind)
    return out, out_x, final_states
