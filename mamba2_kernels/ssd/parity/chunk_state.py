"""Helion ``chunk_state_fwd``: drop-in for mamba-ssm's ``_chunk_state_fwd`` (``mamba2_kernels.ssd.parity``); the SSD
forward runs it fused into ``mamba2_kernels.ssd.chunk_state_passing``, or, where the GPU's rule says so, as the first
kernel of that pass's chain (``mamba2_kernels.ssd.fused_paths``).

states[b,c,h,p,n] = sum_l x[l,p] * B[l,n] * exp(min(dA_cs[Q-1] - dA_cs[l], 0)) * dt[l] over the chunk's
positions l (with seq_idx: only those in the sequence of the chunk's last position). Returns
(b, c, h, p, n), fp32 (B.dtype if ``states_in_fp32`` is False).

One program per (batch, chunk, head, headdim block, dstate block), looping over the chunk in blocks:
x^T (p, k) @ (B * decay * dt) (k, n) on tensor cores in x's dtype, fp32 accumulation.
Tunables: the headdim, dstate and chunk block sizes (mamba-ssm's 9-config GEMM list), warps, stages,
loop order of the grid, indexing.
Shape key: ``dtype`` (x's), ``headdim``, ``dstate``, ``chunk_size``, ``hpg`` (heads per group),
``seq`` (0/1: seq_idx given), ``tokens`` = tokens_bucket(batch * seqlen).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels import _fastmath as fastmath
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import dtype_name, seq_last, tokens


def _shape_key(B, x, dt, dA_cumsum, seq_idx, last_seq, states_in_fp32) -> ShapeKey:
    batch, seqlen, nheads, headdim = x.shape
    return ShapeKey.of(dtype=dtype_name(x.dtype), headdim=headdim, dstate=B.shape[3],
                       chunk_size=dt.shape[3], hpg=nheads // B.shape[2], seq=int(seq_idx is not None),
                       tokens=tokens(batch, seqlen))


@tuned_kernel(name="chunk_state", shape_key=_shape_key, seeds=_seeds.matmul_mnk())
def chunk_state_kernel(
    B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    seq_idx: torch.Tensor | None,
    last_seq: torch.Tensor | None,
    states_in_fp32: hl.constexpr,
) -> torch.Tensor:
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    ngroups = B.shape[2]
    dstate = B.shape[3]
    chunk_size = hl.specialize(chunk_size)
    ratio = nheads // ngroups
    states = torch.empty([batch, nchunks, nheads, headdim, dstate],
                         dtype=torch.float32 if states_in_fp32 else B.dtype, device=x.device)
    block_m = hl.register_block_size(headdim)
    block_n = hl.register_block_size(dstate)
    block_k = hl.register_block_size(chunk_size)
    for tile_b, tile_c, tile_h, tile_m, tile_n in hl.tile(
        [batch, nchunks, nheads, headdim, dstate], block_size=[1, 1, 1, block_m, block_n]
    ):
        b = tile_b.begin
        c = tile_c.begin
        h = tile_h.begin
        dA_last = dA_cumsum[b, h, c, chunk_size - 1].to(torch.float32)
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(chunk_size, block_size=block_k):
            pos = c * chunk_size + tile_k.index
            valid = pos < seqlen
            x_k = hl.load(x, [b, pos, h, tile_m], extra_mask=valid[:, None])
            B_k = hl.load(B, [b, pos, h // ratio, tile_n], extra_mask=valid[:, None])
            dA_k = dA_cumsum[b, h, c, tile_k].to(torch.float32)
            scale = fastmath.exp(torch.where(dA_last - dA_k < 0.0, dA_last - dA_k, 0.0))
            scale = scale * dt[b, h, c, tile_k].to(torch.float32)
            if seq_idx is not None:
                s = hl.load(seq_idx, [b, pos], extra_mask=valid)
                scale = torch.where(s == last_seq[b, c], scale, 0.0)
            B_scaled = (B_k.to(torch.float32) * scale[:, None]).to(x.dtype)
            acc = hl.dot(x_k.T, B_scaled, acc=acc)
        states[b, c, h, tile_m, tile_n] = acc.to(states.dtype)
    return states


def chunk_state_fwd(B, x, dt, dA_cumsum, seq_idx=None, states_in_fp32=True):
    """Same arguments and result as mamba-ssm's ``_chunk_state_fwd`` (without its ``states=`` out)."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    assert nheads % B.shape[2] == 0 and B.shape[:2] == (batch, seqlen)
    assert dA_cumsum.shape == dt.shape == (batch, nheads, nchunks, chunk_size)
    last = None
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
        last = seq_last(seq_idx, chunk_size)
    return chunk_state_kernel(B, x, dt, dA_cumsum, seq_idx, last, bool(states_in_fp32))
