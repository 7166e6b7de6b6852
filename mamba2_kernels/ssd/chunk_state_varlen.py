"""Helion ``chunk_state_varlen``: drop-in for mamba-ssm's ``chunk_state_varlen`` (``_chunk_state_varlen_kernel``),
the final state of each sequence of a packed (batch 1) input, which ``mamba_chunk_scan_combined`` returns as
varlen_states when ``return_varlen_states`` is set.

For sequence s = [start, end) of cu_seqlens, with c the chunk of its last position end - 1 and l0 = c * Q:
states[s,h,p,n] = sum_l x[l,p] * B[l,n] * exp(min(dA_cs[end-1] - dA_cs[l], 0)) * dt[l] over
l in [max(start, l0), end), plus chunk_states[c,h,p,n] * exp(dA_cs[end-1]) when the sequence starts before its
last chunk (start < l0); dA_cs and dt are those of chunk c. chunk_states are the states entering each chunk
(from state passing), so the result is exact when state passing reset the carry at sequence starts (seq_idx
given); an empty sequence gets zeros. Returns (num_seqs, h, p, n) in chunk_states' dtype.

As in mamba-ssm 2.3.2.post1, initial_states are not an argument: they reach sequence 0 only through
chunk_states, i.e. only when sequence 0 does not end in chunk 0.

One program per (sequence, head, headdim block, dstate block), looping over the sequence's last chunk in blocks:
x^T (p, k) @ (B * decay * dt) (k, n) in x's dtype, fp32 accumulation, as ``mamba2_kernels.ssd.parity.chunk_state``.
The host turns cu_seqlens into per-sequence start, end and last position (int32, no host sync).
Tunables: the headdim, dstate and chunk block sizes (mamba-ssm's 9-config GEMM list), warps, stages, loop order,
indexing.
Shape key: ``dtype`` (x's), ``out`` (the states' dtype), ``headdim``, ``dstate``, ``chunk_size``, ``hpg`` (heads
per group), ``tokens`` = tokens_bucket(total seqlen).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels import _fastmath as fastmath
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import dtype_name, tokens


def _shape_key(B, x, dt, dA_cumsum, starts, ends, lasts, chunk_states, chunk_size) -> ShapeKey:
    total_seqlen, nheads, headdim = x.shape
    return ShapeKey.of(dtype=dtype_name(x.dtype), out=dtype_name(chunk_states.dtype), headdim=headdim,
                       dstate=B.shape[2], chunk_size=chunk_size, hpg=nheads // B.shape[1],
                       tokens=tokens(1, total_seqlen))


@tuned_kernel(name="chunk_state_varlen", shape_key=_shape_key, seeds=_seeds.matmul_mnk())
def chunk_state_varlen_kernel(
    B: torch.Tensor,  # (T, g, n)
    x: torch.Tensor,  # (T, h, p)
    dt: torch.Tensor,  # (h, c * Q): flattened over the chunks, so that the index is the position
    dA_cumsum: torch.Tensor,  # (h, c * Q)
    starts: torch.Tensor,  # (S,) int32: first position of each sequence
    ends: torch.Tensor,  # (S,) int32: one past the last position
    lasts: torch.Tensor,  # (S,) int32: the last position, 0 for an empty sequence at 0
    chunk_states: torch.Tensor,  # (c * h * p, n): the states entering each chunk, rows flattened
    chunk_size: hl.constexpr,
) -> torch.Tensor:
    total_seqlen, nheads, headdim = x.shape
    nseqs = starts.shape[0]
    ratio = nheads // B.shape[1]
    dstate = B.shape[2]
    states = torch.empty([nseqs, nheads, headdim, dstate], dtype=chunk_states.dtype, device=x.device)
    block_m = hl.register_block_size(headdim)
    block_n = hl.register_block_size(dstate)
    block_k = hl.register_block_size(chunk_size)
    for tile_s, tile_h, tile_m, tile_n in hl.tile([nseqs, nheads, headdim, dstate],
                                                  block_size=[1, 1, block_m, block_n]):
        h = tile_h.begin
        start = starts[tile_s.begin]
        end = ends[tile_s.begin]
        last = lasts[tile_s.begin]
        chunk = last // chunk_size
        begin = chunk * chunk_size
        # (1,): Helion indexes with tensors of at least one dimension
        dA_last = dA_cumsum[h, last + hl.arange(1)].to(torch.float32)
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(chunk_size, block_size=block_k):
            pos = begin + tile_k.index
            valid = (pos >= start) & (pos < end)
            x_k = hl.load(x, [pos, h, tile_m], extra_mask=valid[:, None])
            B_k = hl.load(B, [pos, h // ratio, tile_n], extra_mask=valid[:, None])
            dA_k = dA_cumsum[h, pos].to(torch.float32)
            scale = fastmath.exp(torch.where(dA_last - dA_k < 0.0, dA_last - dA_k, 0.0))
            scale = torch.where(valid, scale * dt[h, pos].to(torch.float32), 0.0)
            B_scaled = (B_k.to(torch.float32) * scale[:, None]).to(x.dtype)
            acc = hl.dot(x_k.T, B_scaled, acc=acc)
        # The state entering the last chunk carries on only if the sequence started before that chunk.
        rows = (chunk * nheads + h) * headdim + tile_m.index
        carried = hl.load(chunk_states, [rows, tile_n]).to(torch.float32) * torch.exp(dA_last)[:, None]
        acc = acc + torch.where(start < begin, carried, 0.0)
        states[tile_s.begin, h, tile_m, tile_n] = acc.to(states.dtype)
    return states


def sequence_bounds(cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(starts, ends, lasts), int32 (S,): each sequence's first position, one past its last, and its last
    position (0 when it is empty at position 0). Device ops only, no host sync."""
    cu = cu_seqlens.to(torch.int32)
    return cu[:-1].contiguous(), cu[1:].contiguous(), (cu[1:] - 1).clamp(min=0).contiguous()


def chunk_state_varlen(B, x, dt, dA_cumsum, cu_seqlens, chunk_states):
    """Same arguments and result as mamba-ssm's ``chunk_state_varlen``: B (T, g, n), x (T, h, p),
    dt and dA_cumsum (h, c, Q), cu_seqlens (S + 1,), chunk_states (c, h, p, n) -> (S, h, p, n)."""
    total_seqlen, nheads, headdim = x.shape
    _, nchunks, chunk_size = dt.shape
    _, ngroups, dstate = B.shape
    assert nheads % ngroups == 0
    assert B.shape == (total_seqlen, ngroups, dstate)
    assert dt.shape == (nheads, nchunks, chunk_size)
    assert dA_cumsum.shape == dt.shape
    assert chunk_states.shape == (nchunks, nheads, headdim, dstate)
    starts, ends, lasts = sequence_bounds(cu_seqlens)
    flat = (nheads, nchunks * chunk_size)
    return chunk_state_varlen_kernel(B, x, dt.reshape(flat), dA_cumsum.reshape(flat), starts, ends, lasts,
                                     chunk_states.reshape(nchunks * nheads * headdim, dstate), chunk_size)
