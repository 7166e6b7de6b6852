"""Helion ``state_passing_fwd``: drop-in for mamba-ssm's ``_state_passing_fwd`` (``mamba2_kernels.ssd.parity``); the
SSD forward runs it fused into ``mamba2_kernels.ssd.chunk_state_passing``, or, where the GPU's rule says so, as the
second kernel of that pass's chain (``mamba2_kernels.ssd.fused_paths``).

out[:, c] = state entering chunk c (initial_states or 0 for c = 0); carry = exp(dA_chunk_cumsum[c]) * carry +
states[:, c]; with seq_idx the carry is dropped (scale 0) where a chunk's last position is in another
sequence than the previous chunk's (sequence 0 before chunk 0). Returns (out (b,c,h,dim) in out_dtype or
states.dtype, final_states (b,h,dim) fp32).

One program per (batch, head, block of dim). The tunable ``scan`` picks how it crosses the chunks, so
the autotuner keeps whichever is faster for each GPU and shape:
  * ``False`` (default): a sequential loop over chunks, as mamba-ssm;
  * ``True``: all chunks in one tile and ``hl.associative_scan`` of the linear recurrence
    (a1, b1), (a2, b2) -> (a1 a2, a2 b1 + b2) across them.
Measured both tuned (h200-forward-measurements.json, in git history at f878721): the loop runs at the copy roofline,
as mamba-ssm, the scan a little slower.
Other tunables: the dim block (mamba-ssm's BLOCK_SIZE 64..2048), warps, stages, loop unroll.
With seq_idx, the host turns dA_chunk_cumsum into -inf where the carry is dropped (exp(-inf) = 0).
Shape key: ``dim`` (headdim * dstate), ``nheads``, ``dtype`` (out's), ``init`` (0/1), ``tokens`` =
tokens_bucket(batch * nchunks * chunk_size) (chunk_size 256 assumed when not given).
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch
from helion.autotuner import EnumFragment

from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import carry_decay_log, dtype_name, tokens


def _shape_key(states, dA_chunk_cumsum, initial_states, out, final_states, chunk_size) -> ShapeKey:
    batch, nchunks, nheads, dim = states.shape
    return ShapeKey.of(dim=dim, nheads=nheads, dtype=dtype_name(out.dtype), init=int(initial_states is not None),
                       tokens=tokens(batch, nchunks * chunk_size))


def _combine(a1: torch.Tensor, b1: torch.Tensor, a2: torch.Tensor, b2: torch.Tensor):
    return a1 * a2, a2 * b1 + b2


@tuned_kernel(name="state_passing", shape_key=_shape_key, seeds=_seeds.rows(_seeds.STATE_BLOCKS))
def state_passing_kernel(
    states: torch.Tensor,
    dA_chunk_cumsum: torch.Tensor,
    initial_states: torch.Tensor | None,
    out: torch.Tensor,
    final_states: torch.Tensor,
    chunk_size: int,
) -> None:
    batch, nchunks, nheads, dim = states.shape
    block_d = hl.register_block_size(dim)
    block_c = helion.next_power_of_2(nchunks)
    scan = hl.register_tunable("scan", EnumFragment((False, True)))
    for tile_b, tile_h, tile_d in hl.tile([batch, nheads, dim], block_size=[1, 1, block_d]):
        b = tile_b.begin
        h = tile_h.begin
        if scan:
            for tile_all in hl.tile(nchunks, block_size=block_c):
                s = states[b, tile_all, h, tile_d].to(torch.float32)  # (C, D)
                a = torch.exp(dA_chunk_cumsum[b, h, tile_all].to(torch.float32))[:, None] + 0.0 * s
                if initial_states is not None:
                    init = initial_states[b, h, tile_d].to(torch.float32)
                    s = s + torch.where(tile_all.index[:, None] == 0, a * init[None, :], 0.0)
                _, run = hl.associative_scan(_combine, (a, s), dim=0)  # run[c] = state leaving chunk c
                hl.store(out, [b, tile_all.index + 1, h, tile_d], run.to(out.dtype),
                         extra_mask=(tile_all.index + 1 < nchunks)[:, None])
                final_states[b, h, tile_d] = torch.sum(torch.where(tile_all.index[:, None] == nchunks - 1, run, 0.0),
                                                       dim=0)
                first = hl.zeros([tile_d], dtype=torch.float32)
                if initial_states is not None:
                    first = initial_states[b, h, tile_d].to(torch.float32)
                out[b, 0, h, tile_d] = first.to(out.dtype)
        else:
            carry = hl.zeros([tile_d], dtype=torch.float32)
            if initial_states is not None:
                carry = initial_states[b, h, tile_d].to(torch.float32)
            for tile_one in hl.tile(nchunks, block_size=1):
                c = tile_one.begin
                out[b, c, h, tile_d] = carry.to(out.dtype)
                scale = torch.exp(dA_chunk_cumsum[b, h, c].to(torch.float32))
                carry = scale * carry + states[b, c, h, tile_d].to(torch.float32)
            final_states[b, h, tile_d] = carry


def state_passing_fwd(states, dA_chunk_cumsum, initial_states=None, seq_idx=None, chunk_size=None,
                      out_dtype=None):
    """Same arguments and results as mamba-ssm's ``_state_passing_fwd``."""
    batch, nchunks, nheads, dim = states.shape
    assert dA_chunk_cumsum.shape == (batch, nheads, nchunks)
    if initial_states is not None:
        assert initial_states.shape == (batch, nheads, dim)
    if seq_idx is not None:
        assert chunk_size is not None and seq_idx.shape[0] == batch
    dA_chunk_cumsum = carry_decay_log(dA_chunk_cumsum, seq_idx, chunk_size)
    out = torch.empty((batch, nchunks, nheads, dim), device=states.device,
                      dtype=states.dtype if out_dtype is None else out_dtype)
    final_states = torch.empty((batch, nheads, dim), device=states.device, dtype=torch.float32)
    state_passing_kernel(states, dA_chunk_cumsum, initial_states, out, final_states, int(chunk_size or 256))
    return out, final_states
