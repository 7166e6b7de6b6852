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

Fused with chunk_cumsum as well (``chunk_cumsum_state_passing_fwd``, the forward in two launches where a GPU's
rule says so): the kernel takes the call's raw dt and makes each chunk's dt_out = clamp(softplus?(dt +
dt_bias), dt_limit) (0 past seqlen) and dA_cumsum = cumsum(dt_out * A) itself, as ``chunk_cumsum`` does. Every
program of a head computes them, a Q-long scan beside its Q x p x n product; the program at headdim and
dstate block 0 stores them for chunk_scan. That spares chunk_cumsum's launch and the state pass's reads of
both, and the carry's decay is the scan's last element (with seq_idx, -inf across a boundary in the kernel).
The outputs are their own arguments (dt_out, dA_cumsum_out), not dt and dA_cumsum: a loop that writes an
argument it reads gets no per-loop pipelining from Helion, which would change the chained path's code.
Tunables: the headdim and dstate block sizes, warps, stages (of the walk), loop order, indexing.
Shape key: ``dtype`` (x's), ``out`` (out's), ``headdim``, ``dstate``, ``chunk_size``, ``hpg``, ``seq``
(0/1), ``init`` (0/1), ``tokens`` = tokens_bucket(batch * nchunks * chunk_size); fused with chunk_cumsum
also ``cumsum=1``, ``dt`` (the raw dt's dtype), ``bias`` and ``softplus`` (0/1), absent otherwise so that the
chained path keeps its keys.
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._dt import processed_dt
from mamba2_kernels.ssd._keys import by_chunk, carry_decay_log, dtype_name, seq_last, seq_prev, tokens


def _shape_key(B, x, dt, dA_cumsum, dA_chunk, seq_idx, last_seq, initial_states, out, final_states, dt_raw=None,
               dt_out=None, dA_cumsum_out=None, A=None, dt_bias=None, prev_seq=None, dt_softplus=False, dt_min=0.0,
               dt_max=0.0, seqlen=0) -> ShapeKey:
    batch, nchunks, chunk_size, nheads, headdim = x.shape
    fused = {} if dt_raw is None else {"cumsum": 1, "dt": dtype_name(dt_raw.dtype), "bias": int(dt_bias is not None),
                                       "softplus": int(bool(dt_softplus))}
    return ShapeKey.of(dtype=dtype_name(x.dtype), out=dtype_name(out.dtype), headdim=headdim, dstate=B.shape[4],
                       chunk_size=chunk_size, hpg=nheads // B.shape[3], seq=int(seq_idx is not None),
                       init=int(initial_states is not None), tokens=tokens(batch, nchunks * chunk_size), **fused)


@tuned_kernel(name="chunk_state_passing", shape_key=_shape_key, seeds=_seeds.matmul_mn())
def chunk_state_passing_kernel(
    B: torch.Tensor,  # (b, c, Q, g, n): by_chunk views
    x: torch.Tensor,  # (b, c, Q, h, p)
    dt: torch.Tensor | None,  # (b, h, c, Q); None with dt_raw
    dA_cumsum: torch.Tensor | None,
    dA_chunk: torch.Tensor | None,  # (b, h, c): dA_cumsum[..., -1], -inf where the carry is dropped
    seq_idx: torch.Tensor | None,  # (b, c, Q)
    last_seq: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    out: torch.Tensor,
    final_states: torch.Tensor,
    dt_raw: torch.Tensor | None = None,  # (b, c, Q, h): the call's dt by chunk, which makes the next two
    dt_out: torch.Tensor | None = None,  # (b, h, c, Q)
    dA_cumsum_out: torch.Tensor | None = None,
    A: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    prev_seq: torch.Tensor | None = None,  # (b, c): seq_idx before each chunk, with seq_idx and dt_raw
    dt_softplus: hl.constexpr = False,
    dt_min: float = 0.0,
    dt_max: float = 0.0,
    seqlen: int = 0,
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
            if dt_raw is not None:  # chunk_cumsum's work, in every program of the head; the first one stores it
                q = hl.arange(chunk_size)
                d = dt_raw[b, c, :, h].to(torch.float32)
                if dt_bias is not None:
                    d = d + dt_bias[h].to(torch.float32)
                d = processed_dt(d, dt_softplus, dt_min, dt_max, c * chunk_size + q < seqlen)
                dA = torch.cumsum(d * A[h].to(torch.float32), dim=0)
                dA_last = torch.sum(torch.where(q == chunk_size - 1, dA, 0.0), dim=0)
                if tile_m.begin + tile_n.begin == 0:
                    dt_out[b, h, c, :] = d
                    dA_cumsum_out[b, h, c, :] = dA
                scale = torch.exp(torch.where(dA_last - dA < 0.0, dA_last - dA, 0.0)) * d
                decay_log = dA_last
                if seq_idx is not None:
                    decay_log = torch.where(last_seq[b, c] == prev_seq[b, c], dA_last, float("-inf"))
            else:
                dA = dA_cumsum[b, h, c, :].to(torch.float32)
                dA_last = dA_cumsum[b, h, c, chunk_size - 1].to(torch.float32)
                scale = torch.exp(torch.where(dA_last - dA < 0.0, dA_last - dA, 0.0)) * dt[b, h, c, :].to(torch.float32)
            if seq_idx is not None:
                scale = torch.where(seq_idx[b, c, :] == last_seq[b, c], scale, 0.0)
            B_scaled = (B[b, c, :, h // ratio, tile_n].to(torch.float32) * scale[:, None]).to(x.dtype)
            chunk_state = hl.dot(x[b, c, :, h, tile_m].T, B_scaled, out_dtype=torch.float32)
            # The chained path loads the decay last, as before the fusion: a config's per-load lists (indexing,
            # eviction policies) follow the order of the loads.
            if dt_raw is not None:
                carry = torch.exp(decay_log) * carry + chunk_state
            else:
                carry = torch.exp(dA_chunk[b, h, c].to(torch.float32)) * carry + chunk_state
        final_states[b, h, tile_m, tile_n] = carry


def chunk_state_passing_fwd(B, x, dt, dA_cumsum, initial_states=None, seq_idx=None, out_dtype=None):
    """``_chunk_state_fwd(..., states_in_fp32=True)`` then ``_state_passing_fwd`` on its flattened states, in
    one kernel. Returns (states entering each chunk (b, c, h, p, n) in ``out_dtype`` (default fp32),
    final_states (b, h, p, n) fp32)."""
    chunk_size = dt.shape[3]
    assert dA_cumsum.shape == dt.shape == (x.shape[0], x.shape[2], dt.shape[2], chunk_size)
    out, final_states = _outputs(B, x, dt.shape[2], initial_states, seq_idx, out_dtype)
    last = None if seq_idx is None else seq_last(seq_idx, chunk_size)
    chunk_state_passing_kernel(by_chunk(B, chunk_size), by_chunk(x, chunk_size), dt, dA_cumsum,
                               carry_decay_log(dA_cumsum[:, :, :, -1], seq_idx, chunk_size),
                               None if seq_idx is None else by_chunk(seq_idx, chunk_size), last, initial_states, out,
                               final_states)
    return out, final_states


def chunk_cumsum_state_passing_fwd(dt, A, B, x, chunk_size, dt_bias=None, dt_softplus=False,
                                   dt_limit=(0.0, float("inf")), initial_states=None, seq_idx=None, out_dtype=None):
    """``chunk_cumsum_fwd`` then ``chunk_state_passing_fwd`` in one kernel, which makes dt_out and dA_cumsum
    from the call's dt (b, L, h) as it walks the chunks. Returns (dA_cumsum, dt_out (b, h, c, Q) fp32, the states
    entering each chunk in ``out_dtype`` (default fp32), final_states (b, h, p, n) fp32), as the two do."""
    batch, seqlen, nheads = dt.shape
    assert A.shape == (nheads,) and (dt_bias is None or dt_bias.shape == (nheads,))
    nchunks = -(-seqlen // chunk_size)
    out, final_states = _outputs(B, x, nchunks, initial_states, seq_idx, out_dtype)
    dt_out = torch.empty((batch, nheads, nchunks, chunk_size), device=x.device, dtype=torch.float32)
    dA_cumsum = torch.empty_like(dt_out)
    last = prev = None
    if seq_idx is not None:
        last, prev = seq_last(seq_idx, chunk_size), seq_prev(seq_idx, chunk_size)
    chunk_state_passing_kernel(by_chunk(B, chunk_size), by_chunk(x, chunk_size), None, None, None,
                               None if seq_idx is None else by_chunk(seq_idx, chunk_size), last, initial_states, out,
                               final_states, by_chunk(dt, chunk_size), dt_out, dA_cumsum, A, dt_bias, prev,
                               bool(dt_softplus), float(dt_limit[0]), float(dt_limit[1]), seqlen)
    return dA_cumsum, dt_out, out, final_states


def _outputs(B, x, nchunks, initial_states, seq_idx, out_dtype):
    """The states entering each chunk (b, c, h, p, n) in out_dtype (default fp32) and final_states (b, h, p, n)
    fp32, to be written, after checking the inputs' shapes."""
    batch, seqlen, nheads, headdim = x.shape
    dstate = B.shape[3]
    assert nheads % B.shape[2] == 0 and B.shape[:2] == (batch, seqlen)
    assert initial_states is None or initial_states.shape == (batch, nheads, headdim, dstate)
    assert seq_idx is None or seq_idx.shape == (batch, seqlen)
    out = torch.empty((batch, nchunks, nheads, headdim, dstate), device=x.device,
                      dtype=torch.float32 if out_dtype is None else out_dtype)
    return out, torch.empty((batch, nheads, headdim, dstate), device=x.device, dtype=torch.float32)
