"""Helion backward kernels of the chunk_scan stage: drop-ins for mamba-ssm's ``_chunk_scan_bwd_dz``,
``_chunk_scan_bwd_dC`` and ``_chunk_scan_bwd_dcb`` (same arguments, outputs and dtypes as mamba2_kernels/ssd/naive.py).
dCB's ``CB=`` form also gives the intra-chunk ddA from the same products (mamba-ssm: a separate
``_chunk_scan_bwd_ddAcs_stable`` pass); the SSD backward uses that form. Given C and B instead of CB
(``bmm_chunk_scan_bwd_dcb``), the kernel makes each CB tile itself, as bmm_chunk does (every block, zero across
sequences: one C x B^T product over the whole state per tile, in each head split of the group), uses it, and the
first split stores it for the dx kernel: bmm_chunk's launch and the read of CB fewer. mamba-ssm's dstates kernel runs
fused into ``mamba2_kernels.ssd.chunk_state_passing_bwd``; the unfused dstates and stable ddA kernels are in
``mamba2_kernels.ssd.parity``.

Deterministic: no atomics. Where mamba-ssm accumulates across programs with atomic adds (dD, dC and
dCB over head splits), each program writes a partial sum and the host adds them.
Tunables: block sizes (mamba-ssm's autotune lists), warps, stages, indexing, and for dC / dCB the number
of heads one program handles (``heads_per_program``: a divisor of nheads // ngroups, default all of them,
no split; mamba-ssm derives it from the SM count).
Shape keys: ``dtype`` (x's or dout's), ``headdim``, ``dstate``, ``chunk_size``, ``hpg`` (heads per
group), flags for optional arguments, ``tokens`` = tokens_bucket(batch * seqlen); dCB making CB adds ``cb=0``
and ``dstate`` (absent otherwise, so that the other forms keep their keys).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels import _fastmath as fastmath
from mamba2_kernels._buffers import check_out, empty_dense
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import (
    by_chunk,
    d_kind_of,
    dtype_name,
    exclusive_cumsum,
    heads_per_program,
    seq_prev,
    sum_partials,
    tokens,
)

# ---------------------------------------------------------------------------------------------------
# dz: backward of the silu(z) gate


def _dz_key(x, z, out, dout, D, outz, dz, chunk_size, has_ddAcs, recompute_output, d_kind) -> ShapeKey:
    batch, seqlen, nheads, headdim = x.shape
    return ShapeKey.of(dtype=dtype_name(x.dtype), headdim=headdim, chunk_size=chunk_size,
                       D=("none", "h", "hp")[d_kind], ddA=int(bool(has_ddAcs)),
                       outz=int(bool(recompute_output)), tokens=tokens(batch, seqlen))


@tuned_kernel(name="chunk_scan_bwd_dz", shape_key=_dz_key, partial_sums={2: 3}, seeds=_seeds.rows((32, 64, 128), 64))
def chunk_scan_bwd_dz_kernel(
    x: torch.Tensor,
    z: torch.Tensor,
    out: torch.Tensor,
    dout: torch.Tensor,
    D: torch.Tensor | None,
    outz: torch.Tensor,
    dz: torch.Tensor,  # z's shape, written; may be strided (a slice of the layer's input gradient)
    chunk_size: hl.constexpr,
    has_ddAcs: hl.constexpr,
    recompute_output: hl.constexpr,
    d_kind: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    nchunks = (seqlen + chunk_size - 1) // chunk_size
    dout_x = torch.empty_like(dout)
    block_m = hl.register_block_size(chunk_size)
    block_p = hl.register_block_size(headdim)
    nblocks_m = (chunk_size + block_m - 1) // block_m
    # Outputs the call does not ask for are empty: no memory, and nothing unwritten to compare when tuning.
    dD_part = torch.empty([batch, nchunks, nheads, nblocks_m, headdim] if D is not None else [0, 0, 0, 0, 0],
                          dtype=torch.float32, device=x.device)
    ddA = torch.empty([batch, nheads, nchunks, chunk_size] if has_ddAcs else [0, 0, 0, 0], dtype=torch.float32,
                      device=x.device)
    for tile_b, tile_c, tile_h, tile_m in hl.tile([batch, nchunks, nheads, chunk_size],
                                                  block_size=[1, 1, 1, block_m]):
        b = tile_b.begin
        c = tile_c.begin
        h = tile_h.begin
        pos = c * chunk_size + tile_m.index
        valid = pos < seqlen
        acc_dA = hl.zeros([tile_m], dtype=torch.float32)
        for tile_p in hl.tile(headdim, block_size=block_p):
            x_m = hl.load(x, [b, pos, h, tile_p], extra_mask=valid[:, None]).to(torch.float32)
            z_m = hl.load(z, [b, pos, h, tile_p], extra_mask=valid[:, None]).to(torch.float32)
            o_m = hl.load(out, [b, pos, h, tile_p], extra_mask=valid[:, None]).to(torch.float32)
            do_m = hl.load(dout, [b, pos, h, tile_p], extra_mask=valid[:, None]).to(torch.float32)
            sig = torch.sigmoid(z_m)
            dz_m = do_m * o_m * sig * (1.0 + z_m * (1.0 - sig))
            dox = do_m * z_m * sig
            hl.store(dz, [b, pos, h, tile_p], dz_m.to(dz.dtype), extra_mask=valid[:, None])
            hl.store(dout_x, [b, pos, h, tile_p], dox.to(dout_x.dtype), extra_mask=valid[:, None])
            if recompute_output:
                hl.store(outz, [b, pos, h, tile_p], (o_m * z_m * sig).to(outz.dtype), extra_mask=valid[:, None])
            if D is not None:
                dD_part[b, c, h, tile_m.id, tile_p] = torch.sum(dox * x_m, dim=0)
                if has_ddAcs:
                    if d_kind == 2:
                        o_m = o_m - x_m * D[h, tile_p].to(torch.float32)[None, :]
                    else:
                        o_m = o_m - x_m * D[h].to(torch.float32)
            if has_ddAcs:
                acc_dA = acc_dA + torch.sum(dox * o_m, dim=1)
        if has_ddAcs:
            ddA[b, h, c, tile_m] = torch.where(valid, acc_dA, 0.0)
    return dz, dout_x, dD_part, ddA


def chunk_scan_bwd_dz(x, z, out, dout, chunk_size, has_ddAcs=True, D=None, dz=None, recompute_output=False):
    """Same arguments and results as mamba-ssm's ``_chunk_scan_bwd_dz``: (dz, dout_x, dD[, ddA_cumsum]
    [, outz]). ``out`` is the pre-gate output. A given ``dz`` (z's shape and dtype, any strides) is filled by the
    kernel and returned."""
    batch, seqlen, nheads, headdim = x.shape
    assert z.shape == out.shape == dout.shape == x.shape
    check_out("dz", dz, z.shape, z.dtype)
    d_kind = d_kind_of(D, nheads, headdim)
    outz = torch.empty_like(x) if recompute_output else torch.empty(0, device=x.device, dtype=x.dtype)
    dz, dout_x, dD_part, ddA = chunk_scan_bwd_dz_kernel(
        x, z, out, dout, D, outz, empty_dense(z) if dz is None else dz, int(chunk_size), bool(has_ddAcs),
        bool(recompute_output), d_kind)
    dD = None
    if D is not None:
        dD = dD_part.sum(dim=(0, 1, 3))
        dD = (dD.sum(-1) if d_kind == 1 else dD).to(D.dtype)
    vals = (dz, dout_x, dD)
    if has_ddAcs:
        vals = (*vals, ddA)
    if recompute_output:
        vals = (*vals, outz)
    return vals


# ---------------------------------------------------------------------------------------------------
# dC: gradient of C through the state term, and the matching ddA_cumsum


def _dc_key(prev_states, dA_cumsum, dout, seq_idx, prev_seq, C, ngroups, hpg, has_C) -> ShapeKey:
    batch, seqlen, nheads, headdim = dout.shape
    return ShapeKey.of(dtype=dtype_name(dout.dtype), headdim=headdim, dstate=prev_states.shape[4],
                       chunk_size=dA_cumsum.shape[3], hpg=hpg, seq=int(seq_idx is not None),
                       ddA=int(bool(has_C)), tokens=tokens(batch, seqlen))


@tuned_kernel(name="chunk_scan_bwd_dC", shape_key=_dc_key, partial_sums={0: 2, 1: 4},
              seeds=_seeds.tiles_mn_whole_k())
def chunk_scan_bwd_dC_kernel(
    prev_states: torch.Tensor,
    dA_cumsum: torch.Tensor,
    dout: torch.Tensor,
    seq_idx: torch.Tensor | None,
    prev_seq: torch.Tensor | None,
    C: torch.Tensor,
    ngroups: int,
    hpg: hl.constexpr,
    has_C: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = dout.shape
    _, _, nchunks, chunk_size = dA_cumsum.shape
    dstate = prev_states.size(4)
    chunk_size = hl.specialize(chunk_size)
    hpp = hl.register_tunable("heads_per_program", heads_per_program(hpg))
    nsplits = hpg // hpp
    block_m = hl.register_block_size(chunk_size)
    block_n = hl.register_block_size(dstate)
    block_k = hl.register_block_size(headdim)
    nblocks_n = (dstate + block_n - 1) // block_n
    dC_part = torch.empty([batch, seqlen, nsplits, ngroups, dstate], dtype=torch.float32, device=dout.device)
    ddA_part = torch.empty([batch, nheads, nchunks, chunk_size, nblocks_n] if has_C else [0, 0, 0, 0, 0],
                           dtype=torch.float32, device=dout.device)
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
            keep = valid & (s == prev_seq[b, c])
        C_m = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        if has_C:
            C_m = hl.load(C, [b, pos, g, tile_n], extra_mask=valid[:, None]).to(torch.float32)
        acc_C = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for hi in hl.grid(hpp):
            h = g * hpg + split * hpp + hi
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(headdim, block_size=block_k):
                do_k = hl.load(dout, [b, pos, h, tile_k], extra_mask=valid[:, None])
                st = prev_states[b, c, h, tile_k, tile_n].to(dout.dtype)
                acc = hl.dot(do_k, st, acc=acc)
            scale = torch.where(keep, torch.exp(dA_cumsum[b, h, c, tile_m].to(torch.float32)), 0.0)
            acc = acc * scale[:, None]
            acc_C = acc_C + acc
            if has_C:
                ddA_part[b, h, c, tile_m, tile_n.id] = torch.sum(acc * C_m, dim=1)
        hl.store(dC_part, [b, pos, split, g, tile_n], acc_C, extra_mask=valid[:, None])
    return dC_part, ddA_part


def chunk_scan_bwd_dC(prev_states, dA_cumsum, dout, seq_idx=None, C=None, ngroups=1, unfinished=False):
    """Same arguments and results as mamba-ssm's ``_chunk_scan_bwd_dC``: dC (b, L, g, n) fp32, or
    (dC, ddA_cumsum_prev (b, h, c, Q) fp32) when C is given. ``unfinished``: ddA_cumsum_prev as partials
    (b, h, c, Q, k) to be summed over k, for ``chunk_cumsum_bwd_of_terms``."""
    batch, nchunks, nheads, headdim, dstate = prev_states.shape
    _, seqlen, _, _ = dout.shape
    chunk_size = dA_cumsum.shape[-1]
    assert nheads % ngroups == 0
    prev = None
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
        prev = seq_prev(seq_idx, chunk_size)
    dC_part, ddA_part = chunk_scan_bwd_dC_kernel(prev_states, dA_cumsum, dout, seq_idx, prev,
                                                 C if C is not None else prev_states, int(ngroups),
                                                 nheads // ngroups, C is not None)
    dC = sum_partials(dC_part, 2)
    if C is None:
        return dC
    if unfinished:
        return dC, ddA_part
    return dC, sum_partials(ddA_part, -1)


# ---------------------------------------------------------------------------------------------------
# dCB: gradient of C B^T within each chunk, and (given CB) the intra-chunk ddA in the same pass


def _dcb_key(x, dt, dA_cumsum, dout, seq_idx, cb, ngroups, hpg, B=None, C=None, cb_out=None) -> ShapeKey:
    batch, seqlen, nheads, headdim = x.shape
    fused = {} if C is None else {"cb": 0, "dstate": C.shape[4]}
    return ShapeKey.of(dtype=dtype_name(x.dtype), headdim=headdim, chunk_size=dA_cumsum.shape[3], hpg=hpg,
                       seq=int(seq_idx is not None), ddA=int(cb is not None or C is not None),
                       tokens=tokens(batch, seqlen), **fused)


def dcb_sums(dcb_part: torch.Tensor, ddA_steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The dCB kernel's partials summed: (dCB, ddA or None). ddA[t] = sum over l >= t > s of W[l, s], the
    products of the stable ddA kernel. As W is strictly lower triangular, ddA[t + 1] - ddA[t] = (column
    t's sum) - (row t's sum): ddA is the exclusive prefix sum of those steps, summed over the last dim of
    ``ddA_steps`` (see the kernel)."""
    dcb = sum_partials(dcb_part, 2)
    if ddA_steps.numel() == 0:
        return dcb, None
    return dcb, exclusive_cumsum(sum_partials(ddA_steps, -1))


@tuned_kernel(name="chunk_scan_bwd_dcb", shape_key=_dcb_key, finish=dcb_sums, seeds=_seeds.tiles_dcb())
def chunk_scan_bwd_dcb_kernel(
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    dout: torch.Tensor,
    seq_idx: torch.Tensor | None,
    cb: torch.Tensor | None,
    ngroups: int,
    hpg: hl.constexpr,
    B: torch.Tensor | None = None,  # (b, c, Q, g, n) by_chunk views: given (cb None), cb is made here ...
    C: torch.Tensor | None = None,
    cb_out: torch.Tensor | None = None,  # ... and stored in this (b, c, g, Q, Q) fp32 for the dx kernel
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dA_cumsum.shape
    chunk_size = hl.specialize(chunk_size)
    with_ddA = cb is not None or C is not None
    hpp = hl.register_tunable("heads_per_program", heads_per_program(hpg))
    nsplits = hpg // hpp
    block_m = hl.register_block_size(chunk_size)
    block_n = hl.register_block_size(chunk_size)
    block_k = hl.register_block_size(headdim)
    dcb = torch.empty([batch, nchunks, nsplits, ngroups, chunk_size, chunk_size], dtype=torch.float32,
                      device=x.device)
    # The fused ddA as partials of its steps (column sums minus row sums of W), in slots that no two programs
    # share: [.., t, i] row block i's column sums at columns t, [.., t, row_blocks + j] minus column block j's
    # row sums at rows t; zeros where a tile adds nothing.
    fused = [batch, nheads, nchunks, chunk_size] if with_ddA else [0, 0, 0, 0]
    row_blocks = (chunk_size + block_m - 1) // block_m
    col_blocks = (chunk_size + block_n - 1) // block_n
    ddA_steps = torch.zeros([*fused, row_blocks + col_blocks], dtype=torch.float32, device=x.device)
    for tile_b, tile_c, tile_gs, tile_m, tile_n in hl.tile(
        [batch, nchunks, ngroups * nsplits, chunk_size, chunk_size], block_size=[1, 1, 1, block_m, block_n]
    ):
        b = tile_b.begin
        c = tile_c.begin
        g = tile_gs.begin // nsplits
        split = tile_gs.begin % nsplits
        pos_m = c * chunk_size + tile_m.index
        pos_n = c * chunk_size + tile_n.index
        valid_m = pos_m < seqlen
        valid_n = pos_n < seqlen
        acc_cb = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        if C is not None:  # bmm_chunk's tile, every block of it, as the dx kernel reads it; the first split stores it
            cb_mn = hl.dot(C[b, c, tile_m, g, :], B[b, c, tile_n, g, :].T, out_dtype=torch.float32)
            if seq_idx is not None:
                s_cm = hl.load(seq_idx, [b, pos_m], extra_mask=valid_m)
                s_cn = hl.load(seq_idx, [b, pos_n], extra_mask=valid_n)
                cb_mn = torch.where(s_cm[:, None] == s_cn[None, :], cb_mn, 0.0)
            if split == 0:
                cb_out[b, c, g, tile_m, tile_n] = cb_mn
        # A block wholly above the diagonal is zero: skip its products, as mamba-ssm does (without the skip,
        # well below mamba-ssm's speed at chunk 256).
        if tile_n.begin < tile_m.end:
            if cb is not None:
                cb_mn = cb[b, c, g, tile_m, tile_n].to(torch.float32)  # 0 across sequences already
            for hi in hl.grid(hpp):
                h = g * hpg + split * hpp + hi
                acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
                for tile_k in hl.tile(headdim, block_size=block_k):
                    do_k = hl.load(dout, [b, pos_m, h, tile_k], extra_mask=valid_m[:, None]).to(x.dtype)
                    x_k = hl.load(x, [b, pos_n, h, tile_k], extra_mask=valid_n[:, None])
                    acc = hl.dot(do_k, x_k.T, acc=acc)
                dA_m = dA_cumsum[b, h, c, tile_m].to(torch.float32)
                dA_n = dA_cumsum[b, h, c, tile_n].to(torch.float32)
                seg = dA_m[:, None] - dA_n[None, :]
                decay = fastmath.exp(torch.where(seg < 0.0, seg, 0.0))
                acc = acc * decay * dt[b, h, c, tile_n].to(torch.float32)[None, :]
                acc_cb = acc_cb + acc
                if with_ddA:
                    # W[l, s] for l > s; a 1D scan of its column and row sums on the host gives ddA, where the
                    # stable kernel scans each tile in 2D.
                    w = torch.where(tile_m.index[:, None] > tile_n.index[None, :], acc * cb_mn, 0.0)
                    ddA_steps[b, h, c, tile_n, tile_m.id] = torch.sum(w, dim=0)
                    ddA_steps[b, h, c, tile_m, row_blocks + tile_n.id] = -torch.sum(w, dim=1)
        keep = tile_m.index[:, None] >= tile_n.index[None, :]
        if seq_idx is not None:
            s_m = hl.load(seq_idx, [b, pos_m], extra_mask=valid_m)
            s_n = hl.load(seq_idx, [b, pos_n], extra_mask=valid_n)
            keep = keep & (s_m[:, None] == s_n[None, :])
        dcb[b, c, split, g, tile_m, tile_n] = torch.where(keep, acc_cb, 0.0)
    return dcb, ddA_steps


def chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, seq_idx=None, CB=None, ngroups=1, unfinished=False):
    """Same arguments and result as mamba-ssm's ``_chunk_scan_bwd_dcb``: dCB (b, c, g, Q, Q) fp32, lower
    triangle only; with CB, (dCB, ddA), ddA (b, h, c, Q) fp32 as ``_chunk_scan_bwd_ddAcs_stable`` gives it,
    with seq_idx too (mamba-ssm's own CB path, which its backward does not use, supports no seq_idx).
    ``unfinished``: ddA as its steps' partials (b, h, c, Q, k), for ``chunk_cumsum_bwd_of_terms``."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    assert nheads % ngroups == 0
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
    if CB is not None:
        assert CB.shape == (batch, nchunks, ngroups, chunk_size, chunk_size)
    dcb_part, ddA_steps = chunk_scan_bwd_dcb_kernel(x, dt, dA_cumsum, dout, seq_idx, CB, int(ngroups),
                                                    nheads // ngroups)
    if CB is None:
        return dcb_sums(dcb_part, ddA_steps)[0]
    return _dcb_and_ddA(dcb_part, ddA_steps, unfinished)


def bmm_chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, B, C, seq_idx=None, ngroups=1, unfinished=False):
    """bmm_chunk_fwd and chunk_scan_bwd_dcb's ``CB=`` form in one launch: the dCB kernel makes each C B^T tile
    itself (zero across sequences) and stores it for the dx kernel. Returns (CB (b, c, g, Q, Q) fp32, as
    bmm_chunk_fwd gives it, dCB, ddA), as ``mamba2_kernels.ssd.naive.bmm_chunk_scan_bwd_dcb``; ``unfinished``
    as ``chunk_scan_bwd_dcb``."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    assert nheads % ngroups == 0 and B.shape == C.shape == (batch, seqlen, ngroups, C.shape[3])
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
    cb = torch.empty((batch, nchunks, ngroups, chunk_size, chunk_size), device=x.device, dtype=torch.float32)
    dcb_part, ddA_steps = chunk_scan_bwd_dcb_kernel(x, dt, dA_cumsum, dout, seq_idx, None, int(ngroups),
                                                    nheads // ngroups, by_chunk(B, chunk_size),
                                                    by_chunk(C, chunk_size), cb)
    return (cb, *_dcb_and_ddA(dcb_part, ddA_steps, unfinished))


def _dcb_and_ddA(dcb_part, ddA_steps, unfinished):
    """(dCB, ddA) from the kernel's partials; ``unfinished``: ddA as its steps' partials."""
    if unfinished:
        return sum_partials(dcb_part, 2), ddA_steps
    return dcb_sums(dcb_part, ddA_steps)
