"""Helion ``state_passing_bwd``: drop-in for mamba-ssm's ``_state_passing_bwd`` (``mamba2_kernels.ssd.parity``); the
SSD backward runs it fused into ``mamba2_kernels.ssd.chunk_state_passing_bwd``, or, where the GPU's rule says so, as
the second kernel of that pass's chain (``mamba2_kernels.ssd.fused_paths``).

Going backward over chunks: dstates[c] = g_c with g_{nchunks-1} = dfinal_states (or 0) and
g_{c-1} = exp(dA_chunk_cumsum[c]) g_c + dout[c]; ddA_chunk_cumsum[c] = exp(dA[c]) sum_dim states[c] g_c
(0 for c = 0 without initial states); dinitial_states = g_{-1}. ``states`` is the forward's *output*
(the states entering each chunk). With ``states_dtype`` given, the states are also returned converted
(to dstates_dtype when the dtypes differ, as mamba-ssm).

One program per (batch, head, block of dim). The tunable ``scan`` picks how it crosses the chunks, so
the autotuner keeps whichever is faster for each GPU and shape:
  * ``False`` (default): a reverse sequential loop over chunks, as mamba-ssm;
  * ``True``: all chunks in one tile and a reverse ``hl.associative_scan`` of the linear recurrence; its
    inputs are read shifted by one chunk so that the scan yields g_c itself.
ddA_chunk_cumsum is summed over the dim blocks on the host (one partial per block; no atomics).
With seq_idx, the host turns dA_chunk_cumsum into -inf where the carry is dropped (exp(-inf) = 0).
Tunables: the dim block (mamba-ssm's BLOCK_SIZE 64..2048), warps, stages.
Shape key: ``dim``, ``nheads``, ``dtype`` (dout's), ``out`` (dstates'), ``init`` (0/1), ``dfinal``
(0/1), ``convert`` (0/1), ``tokens`` = tokens_bucket(batch * nchunks * chunk_size).
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
from mamba2_kernels.ssd.chunk_state_passing_bwd import finish_outputs


def _shape_key(states, dA_chunk_cumsum, dout, dfinal_states, dstates, dinitial_states, states_converted,
               chunk_size) -> ShapeKey:
    batch, nchunks, nheads, dim = states.shape
    return ShapeKey.of(dim=dim, nheads=nheads, dtype=dtype_name(dout.dtype), out=dtype_name(dstates.dtype),
                       init=int(dinitial_states is not None), dfinal=int(dfinal_states is not None),
                       convert=int(states_converted is not None), tokens=tokens(batch, nchunks * chunk_size))


def _combine(a1: torch.Tensor, b1: torch.Tensor, a2: torch.Tensor, b2: torch.Tensor):
    return a1 * a2, a2 * b1 + b2


@tuned_kernel(name="state_passing_bwd", shape_key=_shape_key, partial_sums={0: 3},
              seeds=_seeds.rows(_seeds.STATE_BLOCKS))
def state_passing_bwd_kernel(
    states: torch.Tensor,
    dA_chunk_cumsum: torch.Tensor,
    dout: torch.Tensor,
    dfinal_states: torch.Tensor | None,
    dstates: torch.Tensor,
    dinitial_states: torch.Tensor | None,
    states_converted: torch.Tensor | None,
    chunk_size: int,
) -> torch.Tensor:
    batch, nchunks, nheads, dim = states.shape
    block_d = hl.register_block_size(dim)
    block_c = helion.next_power_of_2(nchunks)
    scan = hl.register_tunable("scan", EnumFragment((False, True)))
    nblocks_d = (dim + block_d - 1) // block_d
    ddA_part = torch.empty([batch, nheads, nchunks, nblocks_d], dtype=torch.float32, device=states.device)
    for tile_b, tile_h, tile_d in hl.tile([batch, nheads, dim], block_size=[1, 1, block_d]):
        b = tile_b.begin
        h = tile_h.begin
        if scan:
            for tile_all in hl.tile(nchunks, block_size=block_c):
                nxt = tile_all.index + 1
                has_next = nxt < nchunks
                # Element c of the scan: (a, u) = (exp(dA[c + 1]), dout[c + 1]), and (0, dfinal) for the last.
                u = hl.load(dout, [b, nxt, h, tile_d], extra_mask=has_next[:, None]).to(torch.float32)
                a_next = torch.exp(hl.load(dA_chunk_cumsum, [b, h, nxt], extra_mask=has_next).to(torch.float32))
                a = torch.where(has_next, a_next, 0.0)[:, None] + 0.0 * u
                if dfinal_states is not None:
                    fin = dfinal_states[b, h, tile_d].to(torch.float32)
                    u = u + torch.where(tile_all.index[:, None] == nchunks - 1, fin[None, :], 0.0)
                _, grads = hl.associative_scan(_combine, (a, u), dim=0, reverse=True)  # grads[c] = g_c
                dstates[b, tile_all, h, tile_d] = grads.to(dstates.dtype)
                sts = states[b, tile_all, h, tile_d]
                if states_converted is not None:
                    states_converted[b, tile_all, h, tile_d] = sts.to(states_converted.dtype)
                scales = torch.exp(dA_chunk_cumsum[b, h, tile_all].to(torch.float32))
                ddA_part[b, h, tile_all, tile_d.id] = torch.sum(sts.to(torch.float32) * grads, dim=1) * scales
                if dinitial_states is not None:
                    first = torch.sum(torch.where(tile_all.index[:, None] == 0, grads * scales[:, None], 0.0), dim=0)
                    dinitial_states[b, h, tile_d] = (first + dout[b, 0, h, tile_d].to(torch.float32)).to(
                        dinitial_states.dtype)
        else:
            grad = hl.zeros([tile_d], dtype=torch.float32)
            if dfinal_states is not None:
                grad = dfinal_states[b, h, tile_d].to(torch.float32)
            for tile_one in hl.tile(nchunks, block_size=1):
                c = nchunks - 1 - tile_one.begin
                dstates[b, c, h, tile_d] = grad.to(dstates.dtype)
                st = states[b, c, h, tile_d]
                if states_converted is not None:
                    states_converted[b, c, h, tile_d] = st.to(states_converted.dtype)
                scale = torch.exp(dA_chunk_cumsum[b, h, c].to(torch.float32))
                ddA_part[b, h, c, tile_d.id] = torch.sum(st.to(torch.float32) * grad, dim=0) * scale
                grad = scale * grad + dout[b, c, h, tile_d].to(torch.float32)
            if dinitial_states is not None:
                dinitial_states[b, h, tile_d] = grad.to(dinitial_states.dtype)
    return ddA_part


def state_passing_bwd(states, dA_chunk_cumsum, dout, dfinal_states=None, seq_idx=None, has_initial_states=None,
                      dstates_dtype=None, states_dtype=None, chunk_size=None):
    """Same arguments and results as mamba-ssm's ``_state_passing_bwd``: (dstates, ddA_chunk_cumsum,
    dinitial_states or None[, states_converted])."""
    batch, nchunks, nheads, dim = states.shape
    assert dA_chunk_cumsum.shape == (batch, nheads, nchunks)
    assert dout.shape == states.shape
    if dfinal_states is not None:
        assert dfinal_states.shape == (batch, nheads, dim)
    if seq_idx is not None:
        assert chunk_size is not None and seq_idx.shape[0] == batch
    dA_chunk_cumsum = carry_decay_log(dA_chunk_cumsum, seq_idx, chunk_size)
    dst_dtype = dout.dtype if dstates_dtype is None else dstates_dtype
    dstates = torch.empty((batch, nchunks, nheads, dim), device=states.device, dtype=dst_dtype)
    dinit = torch.empty((batch, nheads, dim), device=states.device, dtype=dst_dtype) if has_initial_states else None
    convert = states_dtype is not None and states_dtype != states.dtype
    states_converted = torch.empty_like(states, dtype=dst_dtype) if convert else None
    part = state_passing_bwd_kernel(states, dA_chunk_cumsum, dout, dfinal_states, dstates, dinit, states_converted,
                                    int(chunk_size or 256))
    return finish_outputs(part, dstates, dinit, states, states_converted, states_dtype)

