"""Helion ``bmm_chunk_fwd``: drop-in for mamba-ssm's ``_bmm_chunk_fwd``.

a, b (b, L, g, k) or (b, L, k) -> out (b, c, g, Q, Q) or (b, c, Q, Q), out[i, j] = a[i] . b[j] within
each chunk; 0 at padded rows/columns and, with seq_idx, where seq_idx[i] != seq_idx[j]. With
causal=True entries j > i are 0 (mamba-ssm leaves them undefined). Dtype: output_dtype or a.dtype.

One program per (batch, chunk, group, row block, column block), looping over k in blocks on tensor
cores with fp32 accumulation. Tunables: the three block sizes (mamba-ssm's 9-config list), warps,
stages, grid loop order, indexing.
Shape key: ``dtype`` (a's), ``out`` (output dtype), ``k``, ``chunk_size``, ``causal`` (0/1), ``seq``
(0/1), ``tokens`` = tokens_bucket(batch * seqlen).
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import dtype_name, tokens


def _shape_key(a, b, seq_idx, out, causal) -> ShapeKey:
    batch, seqlen, ngroups, k = a.shape
    return ShapeKey.of(dtype=dtype_name(a.dtype), out=dtype_name(out.dtype), k=k, chunk_size=out.shape[-1],
                       causal=int(bool(causal)), seq=int(seq_idx is not None), tokens=tokens(batch, seqlen))


@tuned_kernel(name="bmm_chunk", shape_key=_shape_key, seeds=_seeds.matmul_mnk())
def bmm_chunk_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    seq_idx: torch.Tensor | None,
    out: torch.Tensor,
    causal: hl.constexpr,
) -> None:
    batch, seqlen, ngroups, k = a.shape
    nchunks = out.size(1)
    chunk_size = out.size(3)
    block_m = hl.register_block_size(chunk_size)
    block_n = hl.register_block_size(chunk_size)
    block_k = hl.register_block_size(k)
    for tile_b, tile_c, tile_g, tile_m, tile_n in hl.tile(
        [batch, nchunks, ngroups, chunk_size, chunk_size], block_size=[1, 1, 1, block_m, block_n]
    ):
        bb = tile_b.begin
        c = tile_c.begin
        g = tile_g.begin
        pos_m = c * chunk_size + tile_m.index
        pos_n = c * chunk_size + tile_n.index
        valid_m = pos_m < seqlen
        valid_n = pos_n < seqlen
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k, block_size=block_k):
            a_k = hl.load(a, [bb, pos_m, g, tile_k], extra_mask=valid_m[:, None])
            b_k = hl.load(b, [bb, pos_n, g, tile_k], extra_mask=valid_n[:, None])
            acc = hl.dot(a_k, b_k.T, acc=acc)
        if seq_idx is not None:
            s_m = hl.load(seq_idx, [bb, pos_m], extra_mask=valid_m)
            s_n = hl.load(seq_idx, [bb, pos_n], extra_mask=valid_n)
            acc = torch.where(s_m[:, None] == s_n[None, :], acc, 0.0)
        if causal:
            acc = torch.where(tile_m.index[:, None] >= tile_n.index[None, :], acc, 0.0)
        out[bb, c, g, tile_m, tile_n] = acc.to(out.dtype)


def bmm_chunk_fwd(a, b, chunk_size, seq_idx=None, causal=False, output_dtype=None):
    """Same arguments and result as mamba-ssm's ``_bmm_chunk_fwd``."""
    has_groups = a.dim() == 4
    assert b.shape == a.shape
    if not has_groups:
        a, b = a.unsqueeze(2), b.unsqueeze(2)
    batch, seqlen, ngroups, _ = a.shape
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
    nchunks = -(-seqlen // chunk_size)
    out = torch.empty((batch, nchunks, ngroups, chunk_size, chunk_size), device=a.device,
                      dtype=a.dtype if output_dtype is None else output_dtype)
    bmm_chunk_kernel(a, b, seq_idx, out, bool(causal))
    return out if has_groups else out.squeeze(2)
