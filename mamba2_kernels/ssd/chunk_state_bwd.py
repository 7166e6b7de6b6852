"""Helion backward kernel of the chunk_state stage: drop-in for mamba-ssm's ``_chunk_state_bwd_db`` (same
arguments, outputs and dtypes as naive.py).

``chunk_state_bwd_db``: db_head[l, n] = exp(min(dA_cs[last] - dA_cs[l], 0)) dt[l] sum_p x[l, p]
dstates[c][p, n] (seq_idx: only l in the sequence of the chunk's last position); dB (b, L, g, n) fp32
sums the heads of each group. With B given also ddA (b, h, c, Q) fp32, the exclusive cumsum over the
chunk of t[l] = sum_n db_head[l, n] B[l, n]. One program per (batch, chunk, group x head split, row
block, dstate block) loops over ``heads_per_program`` heads (a tunable divisor of nheads // ngroups,
default all of them; mamba-ssm derives it from the SM count); head splits and dstate blocks write partial
sums that the host adds (deterministic, no atomics), then takes the exclusive cumsum.
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import dtype_name, exclusive_cumsum, heads_per_program, seq_last, sum_partials, tokens


def _db_key(x, dt, dA_cumsum, dstates, seq_idx, last_seq, B, ngroups, hpg, has_B) -> ShapeKey:
    batch, seqlen, nheads, headdim = x.shape
    return ShapeKey.of(dtype=dtype_name(x.dtype), headdim=headdim, dstate=dstates.shape[4],
                       chunk_size=dt.shape[3], hpg=hpg, seq=int(seq_idx is not None), ddA=int(bool(has_B)),
                       tokens=tokens(batch, seqlen))


@tuned_kernel(name="chunk_state_bwd_db", shape_key=_db_key, partial_sums={0: 2, 1: 4},
              seeds=_seeds.tiles_mn_whole_k())
def chunk_state_bwd_db_kernel(
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    dstates: torch.Tensor,
    seq_idx: torch.Tensor | None,
    last_seq: torch.Tensor | None,
    B: torch.Tensor,
    ngroups: int,
    hpg: hl.constexpr,
    has_B: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    dstate = dstates.size(4)
    chunk_size = hl.specialize(chunk_size)
    hpp = hl.register_tunable("heads_per_program", heads_per_program(hpg))
    nsplits = hpg // hpp
    block_m = hl.register_block_size(chunk_size)
    block_n = hl.register_block_size(dstate)
    block_k = hl.register_block_size(headdim)
    nblocks_n = (dstate + block_n - 1) // block_n
    dB_part = torch.empty([batch, seqlen, nsplits, ngroups, dstate], dtype=torch.float32, device=x.device)
    t_part = torch.empty([batch, nheads, nchunks, chunk_size, nblocks_n] if has_B else [0, 0, 0, 0, 0],
                         dtype=torch.float32, device=x.device)
    for tile_b, tile_c, tile_gs, tile_m, tile_n in hl.tile(
        [batch, nchunks, ngroups * nsplits, chunk_size, dstate], block_size=[1, 1, 1, block_m, block_n]
    ):
        b = tile_b.begin
        c = tile_c.begin
        g = tile_gs.begin // nsplits
        split = tile_gs.begin % nsplits
        pos = c * chunk_size + tile_m.index
        valid = pos < seqlen
        keep = valid
        if seq_idx is not None:
            s = hl.load(seq_idx, [b, pos], extra_mask=valid)
            keep = valid & (s == last_seq[b, c])
        B_m = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        if has_B:
            B_m = hl.load(B, [b, pos, g, tile_n], extra_mask=valid[:, None]).to(torch.float32)
        acc_B = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for hi in hl.grid(hpp):
            h = g * hpg + split * hpp + hi
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(headdim, block_size=block_k):
                x_k = hl.load(x, [b, pos, h, tile_k], extra_mask=valid[:, None])
                ds = dstates[b, c, h, tile_k, tile_n].to(x.dtype)
                acc = hl.dot(x_k, ds, acc=acc)
            dA_m = dA_cumsum[b, h, c, tile_m].to(torch.float32)
            seg = dA_cumsum[b, h, c, chunk_size - 1].to(torch.float32) - dA_m
            scale = torch.exp(torch.where(seg < 0.0, seg, 0.0)) * dt[b, h, c, tile_m].to(torch.float32)
            acc = acc * torch.where(keep, scale, 0.0)[:, None]
            acc_B = acc_B + acc
            if has_B:
                t_part[b, h, c, tile_m, tile_n.id] = torch.sum(acc * B_m, dim=1)
        hl.store(dB_part, [b, pos, split, g, tile_n], acc_B, extra_mask=valid[:, None])
    return dB_part, t_part


def chunk_state_bwd_db(x, dt, dA_cumsum, dstates, seq_idx=None, B=None, ngroups=1, unfinished=False):
    """Same arguments and results as mamba-ssm's ``_chunk_state_bwd_db``: dB (b, L, g, n) fp32, or
    (dB, ddA (b, h, c, Q) fp32) when B is given. ``unfinished``: ddA as its steps' partials (b, h, c, Q, k),
    for ``chunk_cumsum_bwd_of_terms``."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    assert nheads % ngroups == 0
    assert dstates.shape[:4] == (batch, nchunks, nheads, headdim)
    last = None
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
        last = seq_last(seq_idx, chunk_size)
    dB_part, t_part = chunk_state_bwd_db_kernel(x, dt, dA_cumsum, dstates, seq_idx, last,
                                                B if B is not None else x, int(ngroups), nheads // ngroups,
                                                B is not None)
    dB = sum_partials(dB_part, 2)
    if B is None:
        return dB
    return dB, t_part if unfinished else exclusive_cumsum(sum_partials(t_part, -1))
