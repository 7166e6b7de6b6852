"""Helion ``chunk_scan_fwd``: drop-in for mamba-ssm's ``_chunk_scan_fwd``.

y[l] = exp(dA_cs[l]) C[l] . states[c] (0 with seq_idx where l is not in the sequence of the position
before the chunk) + sum_{s <= l} cb[l, s] exp(min(dA_cs[l] - dA_cs[s], 0)) dt[s] x[s] + D x[l].
Returns (out = y * silu(z) if z is given else y, out_x = y if z is given else None), (b, L, h, p) in
x.dtype. D may be None, (h,) or (h, p). cb must already be zero across sequences (bmm_chunk_fwd with
seq_idx does that), as in mamba-ssm.

Fused with bmm_chunk (cb None, B given): each program computes its cb tile, C[l] . B[s] over dstate blocks,
where it would load it, zero across sequences with seq_idx. That spares the cb round trip through memory
(b, c, g, Q, Q fp32: written once, read by every head of the group) and a launch, at the price of computing
cb once per head and headdim block instead of once per group; which path a GPU runs at a shape is its file's
rule (``mamba2_kernels.ssd.fused_paths``).

One program per (batch, chunk, head, row block of the chunk, headdim block): C @ states^T over dstate
blocks, then the causal loop over column blocks up to the diagonal block, both on tensor cores in x's
dtype (C's for the state term) with fp32 accumulation.
Tunables: row, headdim, column and dstate block sizes (mamba-ssm's 11-config list and its
BLOCK_SIZE_DSTATE rule), warps, stages, grid loop order, indexing.
Shape key: ``dtype`` (x's), ``headdim``, ``dstate``, ``chunk_size``, ``hpg`` (heads per group), ``D``
(none / h / hp), ``z`` (0/1), ``seq`` (0/1), ``tokens`` = tokens_bucket(batch * seqlen); and ``cb=0`` when
fused (absent otherwise, so the chained path keeps its keys).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels import _fastmath as fastmath
from mamba2_kernels._buffers import empty_dense
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import check_power_of_two_chunk, d_kind_of, dtype_name, seq_prev, tokens


def _shape_key(cb, x, dt, dA_cumsum, C, states, D, z, seq_idx, prev_seq, out, out_x, d_kind, B=None) -> ShapeKey:
    batch, seqlen, nheads, headdim = x.shape
    fused = {} if cb is not None else {"cb": 0}
    return ShapeKey.of(dtype=dtype_name(x.dtype), headdim=headdim, dstate=C.shape[3], chunk_size=dt.shape[3],
                       hpg=nheads // C.shape[2], D=("none", "h", "hp")[d_kind], z=int(z is not None),
                       seq=int(seq_idx is not None),
                       tokens=tokens(batch, seqlen), **fused)


@tuned_kernel(name="chunk_scan", shape_key=_shape_key, seeds=[*_seeds.matmul_mnkk(), _seeds.SWEPT_CHUNK_SCAN])
def chunk_scan_kernel(
    cb: torch.Tensor | None,
    x: torch.Tensor,
    dt: torch.Tensor,
    dA_cumsum: torch.Tensor,
    C: torch.Tensor,
    states: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    prev_seq: torch.Tensor | None,
    out: torch.Tensor,
    out_x: torch.Tensor | None,
    d_kind: hl.constexpr,
    B: torch.Tensor | None = None,
) -> None:
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    ngroups = C.shape[2]
    dstate = C.shape[3]
    chunk_size = hl.specialize(chunk_size)
    ratio = nheads // ngroups
    block_m = hl.register_block_size(chunk_size)
    block_n = hl.register_block_size(headdim)
    block_k = hl.register_block_size(chunk_size)
    block_s = hl.register_block_size(dstate)
    for tile_b, tile_c, tile_h, tile_m, tile_n in hl.tile(
        [batch, nchunks, nheads, chunk_size, headdim], block_size=[1, 1, 1, block_m, block_n]
    ):
        b = tile_b.begin
        c = tile_c.begin
        h = tile_h.begin
        g = h // ratio
        pos_m = c * chunk_size + tile_m.index
        valid_m = pos_m < seqlen
        dA_m = dA_cumsum[b, h, c, tile_m].to(torch.float32)
        # Inter-chunk part: C[l] . states[c], decayed to each position.
        acc_s = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_s in hl.tile(dstate, block_size=block_s):
            C_s = hl.load(C, [b, pos_m, g, tile_s], extra_mask=valid_m[:, None])
            st = states[b, c, h, tile_n, tile_s].to(C.dtype)
            acc_s = hl.dot(C_s, st.T, acc=acc_s)
        scale_m = fastmath.exp(dA_m)
        if seq_idx is not None:
            s_m = hl.load(seq_idx, [b, pos_m], extra_mask=valid_m)
            scale_m = torch.where(s_m == prev_seq[b, c], scale_m, 0.0)
        acc = acc_s * scale_m[:, None]
        # Intra-chunk causal part, column blocks up to the diagonal.
        for tile_k in hl.tile(0, (tile_m.id + 1) * block_m, block_size=block_k):
            pos_k = c * chunk_size + tile_k.index
            valid_k = pos_k < seqlen
            if cb is not None:
                w = cb[b, c, g, tile_m, tile_k].to(torch.float32)
            else:  # bmm_chunk's tile, written again: Helion cannot call a device loop in a helper (helion#865)
                w = hl.zeros([tile_m, tile_k], dtype=torch.float32)
                for tile_t in hl.tile(dstate, block_size=block_s):
                    C_t = hl.load(C, [b, pos_m, g, tile_t], extra_mask=valid_m[:, None])
                    B_t = hl.load(B, [b, pos_k, g, tile_t], extra_mask=valid_k[:, None])
                    w = hl.dot(C_t, B_t.T, acc=w)
                if seq_idx is not None:
                    s_mk = hl.load(seq_idx, [b, pos_m], extra_mask=valid_m)
                    s_k = hl.load(seq_idx, [b, pos_k], extra_mask=valid_k)
                    w = torch.where(s_mk[:, None] == s_k[None, :], w, 0.0)
            dA_k = dA_cumsum[b, h, c, tile_k].to(torch.float32)
            seg = dA_m[:, None] - dA_k[None, :]
            w = w * fastmath.exp(torch.where(seg < 0.0, seg, 0.0))
            w = w * dt[b, h, c, tile_k].to(torch.float32)[None, :]
            w = torch.where(tile_m.index[:, None] >= tile_k.index[None, :], w, 0.0).to(x.dtype)
            x_k = hl.load(x, [b, pos_k, h, tile_n], extra_mask=valid_k[:, None])
            acc = hl.dot(w, x_k, acc=acc)
        if D is not None:
            x_m = hl.load(x, [b, pos_m, h, tile_n], extra_mask=valid_m[:, None]).to(torch.float32)
            if d_kind == 2:
                acc = acc + x_m * D[h, tile_n].to(torch.float32)[None, :]
            else:
                acc = acc + x_m * D[h].to(torch.float32)
        if out_x is not None:
            hl.store(out_x, [b, pos_m, h, tile_n], acc.to(x.dtype), extra_mask=valid_m[:, None])
            z_m = hl.load(z, [b, pos_m, h, tile_n], extra_mask=valid_m[:, None]).to(torch.float32)
            acc = acc * z_m * torch.sigmoid(z_m)
        hl.store(out, [b, pos_m, h, tile_n], acc.to(x.dtype), extra_mask=valid_m[:, None])


def chunk_scan_fwd(cb, x, dt, dA_cumsum, C, states, D=None, z=None, seq_idx=None, B=None):
    """Same arguments and results as mamba-ssm's ``_chunk_scan_fwd``: (out, out_x or None). With ``cb`` None
    and ``B`` (b, L, g, n) given, the kernel computes cb itself: bmm_chunk_fwd and this stage in one launch."""
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    ngroups, dstate = C.shape[2], C.shape[3]
    assert nheads % ngroups == 0 and C.shape[:2] == (batch, seqlen)
    if cb is None:
        if B is None or B.shape != C.shape or B.dtype != C.dtype:
            raise ValueError(f"B: expected a tensor of C's shape {tuple(C.shape)} and dtype {C.dtype} when cb is "
                             f"None, got {None if B is None else (tuple(B.shape), B.dtype)}")
    else:
        assert cb.shape == (batch, nchunks, ngroups, chunk_size, chunk_size)
        B = None
    assert dA_cumsum.shape == dt.shape == (batch, nheads, nchunks, chunk_size)
    assert states.shape == (batch, nchunks, nheads, headdim, dstate)
    check_power_of_two_chunk("chunk_scan_fwd", chunk_size)
    d_kind = d_kind_of(D, nheads, headdim)
    if z is not None:
        assert z.shape == x.shape
    prev = None
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
        prev = seq_prev(seq_idx, chunk_size)
    out = empty_dense(x)
    out_x = empty_dense(x) if z is not None else None
    chunk_scan_kernel(cb, x, dt, dA_cumsum, C, states, D, z, seq_idx, prev, out, out_x, d_kind, B)
    return out, out_x


def bmm_chunk_scan_fwd(x, dt, dA_cumsum, B, C, states, D=None, z=None, seq_idx=None):
    """bmm_chunk_fwd and chunk_scan_fwd in one launch: chunk_scan makes each cb tile from C and B itself.
    Same results as ``mamba2_kernels.ssd.naive.bmm_chunk_scan_fwd``: (out, out_x or None)."""
    return chunk_scan_fwd(None, x, dt, dA_cumsum, C, states, D=D, z=z, seq_idx=seq_idx, B=B)
