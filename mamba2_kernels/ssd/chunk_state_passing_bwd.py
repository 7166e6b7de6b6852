"""Helion backward of the chunk states in one pass: what mamba-ssm's combined backward runs as
``_chunk_scan_bwd_dstates`` then ``_state_passing_bwd``.

Going backward over chunks with g = dfinal_states (or 0): dstates[c] = g; ddA_chunk_cumsum[c] =
exp(dA[c]) sum_{p,n} states[c] g (0 for c = 0 without initial states); then g = exp(dA[c]) g + u_c, where
u_c = sum_l exp(dA_cumsum[l]) dout[l]^T C[l] over chunk c is the gradient of the state entering chunk c
from that chunk's outputs (``mamba2_kernels.ssd.parity.chunk_scan_bwd_dstates``); dinitial_states = g at the
end. ``states`` are the states entering each chunk (fp32, as the backward recomputes them); with
``states_dtype`` given they are also returned converted, as mamba-ssm's state passing backward does.

One program per (batch, head, headdim block, dstate block) walks the chunks in reverse, u_c on tensor cores
as the dstates kernel computes it (dout scaled and rounded to its dtype, fp32 accumulation), so u (b, c, h,
p, n) in fp32, which mamba-ssm writes and reads back between its two kernels, never reaches memory. Each
chunk is one tile, so the walk is the kernel's only loop (as in ``mamba2_kernels.ssd.chunk_state_passing``; a little
faster than the first version, which looped over the chunk inside the walk).
ddA_chunk_cumsum comes as one partial per (headdim block, dstate block), summed on the host (no atomics).
seq_idx: positions outside the sequence of the position before their chunk add nothing to u_c, and the host
turns exp(dA[c]) into 0 where the carry crosses a sequence boundary. C, dout and seq_idx come as (b, c, Q,
...) views (padded where ragged).
Tunables: the headdim and dstate block sizes, warps, stages (of the walk), loop order, indexing.
Shape key: ``dtype`` (dout's), ``out`` (dstates'), ``headdim``, ``dstate``, ``chunk_size``, ``hpg``,
``seq``, ``init``, ``dfinal``, ``convert`` (0/1 each), ``tokens`` = tokens_bucket(batch * nchunks * chunk_size).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import by_chunk, carry_decay_log, dtype_name, seq_prev, sum_partials, tokens


def _shape_key(C, dA_cumsum, dout, states, dA_chunk, dfinal_states, seq_idx, prev_seq, dstates, dinitial_states,
               states_converted) -> ShapeKey:
    batch, nchunks, chunk_size, nheads, headdim = dout.shape
    return ShapeKey.of(dtype=dtype_name(dout.dtype), out=dtype_name(dstates.dtype), headdim=headdim,
                       dstate=C.shape[4], chunk_size=chunk_size, hpg=nheads // C.shape[3],
                       seq=int(seq_idx is not None), init=int(dinitial_states is not None),
                       dfinal=int(dfinal_states is not None), convert=int(states_converted is not None),
                       tokens=tokens(batch, nchunks * chunk_size))


@tuned_kernel(name="chunk_state_passing_bwd", shape_key=_shape_key, partial_sums={0: 3}, seeds=_seeds.matmul_mn())
def chunk_state_passing_bwd_kernel(
    C: torch.Tensor,  # (b, c, Q, g, n): by_chunk views
    dA_cumsum: torch.Tensor,
    dout: torch.Tensor,  # (b, c, Q, h, p)
    states: torch.Tensor,
    dA_chunk: torch.Tensor,  # (b, h, c): dA_cumsum[..., -1], -inf where the carry is dropped
    dfinal_states: torch.Tensor | None,
    seq_idx: torch.Tensor | None,  # (b, c, Q)
    prev_seq: torch.Tensor | None,
    dstates: torch.Tensor,
    dinitial_states: torch.Tensor | None,
    states_converted: torch.Tensor | None,
) -> torch.Tensor:
    batch, nchunks, chunk_size, nheads, headdim = dout.shape
    chunk_size = hl.specialize(chunk_size)
    ratio = nheads // C.shape[3]
    dstate = C.shape[4]
    block_m = hl.register_block_size(headdim)
    block_n = hl.register_block_size(dstate)
    nblocks_n = (dstate + block_n - 1) // block_n
    nblocks = (headdim + block_m - 1) // block_m * nblocks_n
    ddA_part = torch.empty([batch, nheads, nchunks, nblocks], dtype=torch.float32, device=dout.device)
    for tile_b, tile_h, tile_m, tile_n in hl.tile([batch, nheads, headdim, dstate],
                                                  block_size=[1, 1, block_m, block_n]):
        b = tile_b.begin
        h = tile_h.begin
        grad = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        if dfinal_states is not None:
            grad = dfinal_states[b, h, tile_m, tile_n].to(torch.float32)
        # The one loop, over chunks, each chunk one tile (as in the forward).
        for tile_one in hl.tile(nchunks, block_size=1):
            c = nchunks - 1 - tile_one.begin
            dstates[b, c, h, tile_m, tile_n] = grad.to(dstates.dtype)
            st = states[b, c, h, tile_m, tile_n]
            if states_converted is not None:
                states_converted[b, c, h, tile_m, tile_n] = st.to(states_converted.dtype)
            decay = torch.exp(dA_chunk[b, h, c].to(torch.float32))
            ddA_part[b, h, c, tile_m.id * nblocks_n + tile_n.id] = torch.sum(
                torch.sum(st.to(torch.float32) * grad, dim=1), dim=0) * decay
            scale = torch.exp(dA_cumsum[b, h, c, :].to(torch.float32))
            if seq_idx is not None:
                scale = torch.where(seq_idx[b, c, :] == prev_seq[b, c], scale, 0.0)
            do_c = (dout[b, c, :, h, tile_m].to(torch.float32) * scale[:, None]).to(dout.dtype)
            u = hl.dot(do_c.T, C[b, c, :, h // ratio, tile_n].to(dout.dtype), out_dtype=torch.float32)
            grad = decay * grad + u
        if dinitial_states is not None:
            dinitial_states[b, h, tile_m, tile_n] = grad.to(dinitial_states.dtype)
    return ddA_part


def chunk_state_passing_bwd(C, dA_cumsum, dout, states, dfinal_states=None, seq_idx=None, has_initial_states=False,
                            dstates_dtype=None, states_dtype=None):
    """``_chunk_scan_bwd_dstates(..., dtype=states.dtype)`` then ``_state_passing_bwd`` on the flattened
    states, in one kernel. ``states`` (b, c, h, p, n): the states entering each chunk. Returns (dstates
    (b, c, h, p, n) in ``dstates_dtype`` (default dout's), ddA_chunk_cumsum (b, h, c) fp32, dinitial_states
    or None[, the states converted as ``_state_passing_bwd`` converts them, when ``states_dtype`` is given])."""
    batch, seqlen, nheads, headdim = dout.shape
    _, _, nchunks, chunk_size = dA_cumsum.shape
    dstate = C.shape[3]
    assert C.shape[:2] == (batch, seqlen) and nheads % C.shape[2] == 0
    assert states.shape == (batch, nchunks, nheads, headdim, dstate)
    if dfinal_states is not None:
        assert dfinal_states.shape == (batch, nheads, headdim, dstate)
    prev = None
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
        prev = seq_prev(seq_idx, chunk_size)
    dst_dtype = dout.dtype if dstates_dtype is None else dstates_dtype
    dstates = torch.empty_like(states, dtype=dst_dtype)
    dinit = torch.empty((batch, nheads, headdim, dstate), device=dout.device, dtype=dst_dtype) \
        if has_initial_states else None
    convert = states_dtype is not None and states_dtype != states.dtype
    states_converted = torch.empty_like(states, dtype=dst_dtype) if convert else None
    decay_log = carry_decay_log(dA_cumsum[:, :, :, -1], seq_idx, chunk_size)
    part = chunk_state_passing_bwd_kernel(by_chunk(C, chunk_size), dA_cumsum, by_chunk(dout, chunk_size), states,
                                          decay_log, dfinal_states,
                                          None if seq_idx is None else by_chunk(seq_idx, chunk_size), prev, dstates,
                                          dinit, states_converted)
    return finish_outputs(part, dstates, dinit, states, states_converted, states_dtype)


def finish_outputs(ddA_part, dstates, dinitial_states, states, states_converted, states_dtype):
    """The state passing backward's results as mamba-ssm returns them, from a kernel's outputs: ddA_chunk_cumsum
    summed over its per-block partials (last dimension), 0 at chunk 0 without initial states, and the states
    (converted where they were) when ``states_dtype`` is given."""
    ddA = sum_partials(ddA_part, -1)
    if dinitial_states is None:
        ddA[..., 0] = 0.0
    vals = (dstates, ddA, dinitial_states)
    if states_dtype is None:
        return vals
    return (*vals, states if states_converted is None else states_converted)
