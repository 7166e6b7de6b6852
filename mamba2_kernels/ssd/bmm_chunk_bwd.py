"""Helion ``bmm_chunk_bwd``: drop-in for mamba-ssm's ``_bmm_chunk_bwd``, the gradient of ``b`` in
out = bmm_chunk_fwd(a, b): db[s] = sum_i dout[i, s] a[i] (+ residual) within each chunk.

a: (b, L, g, k) or (b, L, k); dout: (b, c, g, Q, Q) or (b, c, Q, Q). Returns db in a's shape, dtype
``out.dtype`` if ``out`` is given (it is then filled) else a.dtype.
One program per (batch, chunk, group, block of s, block of k), looping over i blocks: dout^T @ a on tensor
cores in a's dtype, fp32 accumulation, the residual added in fp32.
Tunables: the s, k and i block sizes (mamba-ssm's 9-config list), warps, stages, indexing.
Shape key: ``dtype`` (a's), ``out`` (result dtype), ``k``, ``chunk_size``, ``residual`` (0/1), ``tokens``.
"""

from __future__ import annotations

import helion.language as hl
import torch

from mamba2_kernels._buffers import check_out
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import dtype_name, tokens


def _shape_key(a, dout, residual, out) -> ShapeKey:
    batch, seqlen, ngroups, k = a.shape
    return ShapeKey.of(dtype=dtype_name(a.dtype), out=dtype_name(out.dtype), k=k, chunk_size=dout.shape[-1],
                       residual=int(residual is not None), tokens=tokens(batch, seqlen))


@tuned_kernel(name="bmm_chunk_bwd", shape_key=_shape_key, seeds=_seeds.matmul_mnk())
def bmm_chunk_bwd_kernel(
    a: torch.Tensor,
    dout: torch.Tensor,
    residual: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    batch, seqlen, ngroups, k = a.shape
    nchunks = dout.size(1)
    chunk_size = dout.size(3)
    block_s = hl.register_block_size(chunk_size)
    block_k = hl.register_block_size(k)
    block_i = hl.register_block_size(chunk_size)
    for tile_b, tile_c, tile_g, tile_s, tile_k in hl.tile(
        [batch, nchunks, ngroups, chunk_size, k], block_size=[1, 1, 1, block_s, block_k]
    ):
        bb = tile_b.begin
        c = tile_c.begin
        g = tile_g.begin
        pos_s = c * chunk_size + tile_s.index
        valid_s = pos_s < seqlen
        acc = hl.zeros([tile_s, tile_k], dtype=torch.float32)
        for tile_i in hl.tile(chunk_size, block_size=block_i):
            pos_i = c * chunk_size + tile_i.index
            a_i = hl.load(a, [bb, pos_i, g, tile_k], extra_mask=(pos_i < seqlen)[:, None])
            d = dout[bb, c, g, tile_i, tile_s].to(a.dtype)  # (i, s)
            acc = hl.dot(d.T, a_i, acc=acc)
        if residual is not None:
            acc = acc + hl.load(residual, [bb, pos_s, g, tile_k], extra_mask=valid_s[:, None]).to(torch.float32)
        hl.store(out, [bb, pos_s, g, tile_k], acc.to(out.dtype), extra_mask=valid_s[:, None])


def bmm_chunk_bwd(a, dout, residual=None, out=None):
    """Same arguments and result as mamba-ssm's ``_bmm_chunk_bwd``. A given ``out`` (a's shape, any floating
    dtype, any strides) is filled by the kernel, cast on store, and returned."""
    check_out("out", out, a.shape, None)
    result = torch.empty_like(a) if out is None else out
    grouped = result
    if a.dim() == 3:
        a, dout, grouped = a.unsqueeze(2), dout.unsqueeze(2), result.unsqueeze(2)
        residual = None if residual is None else residual.unsqueeze(2)
    batch, seqlen, ngroups, k = a.shape
    assert dout.shape[:3] == (batch, -(-seqlen // dout.shape[-1]), ngroups)
    if residual is not None:
        assert residual.shape == a.shape
    bmm_chunk_bwd_kernel(a, dout, residual, grouped)
    return result
