"""Helion chunk state and state passing in one pass: what mamba-ssm's combined forward (and its backward's
recompute) runs as ``_chunk_state_fwd`` then ``_state_passing_fwd``.

out[:, c] is the state entering chunk c (initial_states or 0 for c = 0), final_states the state leaving the
last; carry = exp(dA_cumsum[c, -1]) * carry + chunk_state(c), chunk_state(c) = x_c^T (B_c * decay * dt) as
in ``mamba2_kernels.ssd.parity.chunk_state`` (B scaled and rounded to x's dtype, fp32 accumulation, fp32 carry).

One program per (batch, head, headdim block, dstate block) walks the chunks in order, carrying its block of
the state in registers, so the per-chunk fp32 states (b, c, h, p, n) that mamba-ssm writes between its two
kernels and reads back never reach memory. Each chunk is one tile, so the walk is the kernel's only loop,
which Triton can pipeline (the next chunks' loads under the current product): faster than a first version
that looped over the chunk in blocks inside the walk, most with fp32 out. x, B and seq_idx come as (b, c, Q, ...)
views (a padded copy when the chunk size does not divide seqlen).
With seq_idx, positions outside the sequence of their chunk's last position add nothing, and the host turns
the chunk's decay into exp(-inf) = 0 where the carry crosses a sequence boundary, as the two kernels do.
Tunables: the headdim and dstate block sizes, warps, stages (of the walk), loop order, indexing.
Shape key: ``dtype`` (x's), ``out`` (out's), ``headdim``, ``dstate``, ``chunk_size``, ``hpg``, ``seq``
(0/1), ``init`` (0/1), ``tokens`` = tokens_bucket(batch * nchunks * chunk_size).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import by_chunk, carry_decay_log, dtype_name, seq_last, tokens


def _shape_key(B, x, dt, dA_cumsum, dA_chunk, seq_idx, last_seq, initial_states, out, final_states) -> ShapeKey:
    batch, nchunks, chunk_size, nheads, headdim = x.shape
    return ShapeKey.of(dtype=dtype_name(x.dtype), out=dtype_name(out.dtype), headdim=headdim, dstate=B.shape[4],
                       chunk_size=chunk_size, hpg=nheads // B.shape[3], seq=int(seq_idx is not None),
                       init=int(initial_states is not None), tokens=tokens(batch, nchunks * chunk_size))


@tuned_kernel(name="chunk_state_passing", shape_key=_shape_key, seeds=_seeds.matmul_mn())
def chunk_state_passing_kernel(
    B: torch.Tensor,  # (b, c, Q, g, n): by_chunk views
    x: torch.Tensor,  # (b, c, Q, h, p)
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    dA_chunk: torch.Tensor,  # (b, h, c): dA_cumsum[..., -1], -inf where the carry is dropped
    seq_idx: torch.Tensor | None,  # (b, c, Q)
    last_seq: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    out: torch.Tensor,
    final_states: torch.Tensor,
) -> None:
    batch, nchunks, chunk_size, nheads, headdim = x.shape
    chunk_size = hl.specialize(chunk_size)
    ratio = nheads // B.shape[3]
    dstate = B.shape[4]
    block_m = hl.register_block_size(headdim)
    block_n = hl.register_block_size(dstate)
    for tile_b, tile_h, tile_m, tile_n in hl.tile([batch, nheads, headdim, dstate],
                                                  block_size=[1, 1, block_m, block_n]):
        b = tile_b.begin
        h = tile_h.begin
        carry = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        if initial_states is not None:
            carry = initial_states[b, h, tile_m, tile_n].to(torch.float32)
        # The one loop, over chunks, each chunk one tile (see the module docstring).
        for tile_c in hl.tile(nchunks, block_size=1):
            c = tile_c.begin
            out[b, c, h, tile_m, tile_n] = carry.to(out.dtype)
            dA = dA_cumsum[b, h, c, :].to(torch.float32)
            dA_last = dA_cumsum[b, h, c, chunk_size - 1].to(torch.float32)
            scale = torch.exp(torch.where(dA_last - dA < 0.0, dA_last - dA, 0.0)) * dt[b, h, c, :].to(torch.float32)
            if seq_idx is not None:
                scale = torch.where(seq_idx[b, c, :] == last_seq[b, c], scale, 0.0)
            B_scaled = (B[b, c, :, h // ratio, tile_n].to(torch.float32) * scale[:, None]).to(x.dtype)
            chunk_state = hl.dot(x[b, c, :, h, tile_m].T, B_scaled, out_dtype=torch.float32)
            carry = torch.exp(dA_chunk[b, h, c].to(torch.float32)) * carry + chunk_state
        final_states[b, h, tile_m, tile_n] = carry


def chunk_state_passing_fwd(B, x, dt, dA_cumsum, initial_states=None, seq_idx=None, out_dtype=None):
    """``_chunk_state_fwd(..., states_in_fp32=True)`` then ``_state_passing_fwd`` on its flattened states, in
    one kernel. Returns (states entering each chunk (b, c, h, p, n) in ``out_dtype`` (default fp32),
    final_states (b, h, p, n) fp32)."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    dstate = B.shape[3]
    assert nheads % B.shape[2] == 0 and B.shape[:2] == (batch, seqlen)
    assert dA_cumsum.shape == dt.shape == (batch, nheads, nchunks, chunk_size)
    if initial_states is not None:
        assert initial_states.shape == (batch, nheads, headdim, dstate)
    last = None
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
        last = seq_last(seq_idx, chunk_size)
    out = torch.empty((batch, nchunks, nheads, headdim, dstate), device=x.device,
                      dtype=torch.float32 if out_dtype is None else out_dtype)
    final_states = torch.empty((batch, nheads, headdim, dstate), device=x.device, dtype=torch.float32)
    decay_log = carry_decay_log(dA_cumsum[:, :, :, -1], seq_idx, chunk_size)
    chunk_state_passing_kernel(by_chunk(B, chunk_size), by_chunk(x, chunk_size), dt, dA_cumsum, decay_log,
                               None if seq_idx is None else by_chunk(seq_idx, chunk_size), last, initial_states, out,
                               final_states)
    return out, final_states
