"""Helion backward kernel of the chunk_cumsum stage: drop-in for mamba-ssm's ``_chunk_cumsum_bwd`` (same
arguments, outputs and dtypes as naive.py), and the SSD backward's last stage.

``chunk_cumsum_bwd``: ddt = (ddA A + ddt_out) masked by dt_limit and times softplus' (sigmoid), dA =
sum ddA dt_out, ddt_bias = sum ddt. One program per (batch, chunk, head block) over the whole chunk, its
tiles (heads, positions) as in chunk_cumsum_fwd (dt and ddt through (b, h, L) views); dA and ddt_bias are
per-(batch, chunk) partials added on the host. ``chunk_cumsum_bwd_of_terms`` is the
SSD backward's form: it builds ddA itself from the three stages' unfinished terms.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from mamba2_kernels import _fastmath as fastmath
from mamba2_kernels._buffers import check_out, empty_dense
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey
from mamba2_kernels.ssd import _seeds
from mamba2_kernels.ssd._keys import dtype_name, tokens


def _cumsum_key(ddA, intra_steps, next_steps, prev_parts, chunk_grad, ddt_out, dt_hl, A, dt_bias, ddt_hl,
                dt_softplus, dt_min, dt_max) -> ShapeKey:
    batch, nheads, seqlen = dt_hl.shape
    terms = {} if ddA is not None else {"terms": 1}  # the drop-in's keys predate the terms form
    return ShapeKey.of(dtype=dtype_name(dt_hl.dtype), nheads=nheads, chunk_size=ddt_out.shape[3],
                       bias=int(dt_bias is not None), softplus=int(bool(dt_softplus)), **terms,
                       tokens=tokens(batch, seqlen))


@tuned_kernel(name="chunk_cumsum_bwd", shape_key=_cumsum_key, seeds=_seeds.rows(_seeds.HEAD_BLOCKS))
def chunk_cumsum_bwd_kernel(
    ddA: torch.Tensor | None,  # (b, h, c, Q) finished; else the four terms below
    intra_steps: torch.Tensor | None,  # (b, h, c, Q, k): summed over k, the steps of ddA_intra
    next_steps: torch.Tensor | None,  # (b, h, c, Q, k): summed over k, the steps of ddA_next
    prev_parts: torch.Tensor | None,  # (b, h, c, Q, k): summed over k, ddA_cumsum_prev
    chunk_grad: torch.Tensor | None,  # (b, h, c): the gradient of each chunk's last dA_cumsum
    ddt_out: torch.Tensor,
    dt_hl: torch.Tensor,  # dt and ddt as (b, h, L) views: (heads, positions) tiles, as the (b, h, c, Q) tensors
    A: torch.Tensor,
    dt_bias: torch.Tensor | None,
    ddt_hl: torch.Tensor,
    dt_softplus: hl.constexpr,
    dt_min: float,
    dt_max: float,
) -> torch.Tensor:
    batch, nheads, seqlen = dt_hl.shape
    _, _, nchunks, chunk_size = ddt_out.shape
    chunk_size = hl.specialize(chunk_size)
    # Per (batch, chunk) partial sums of dA (0) and ddt_bias (1), summed on the host in one reduction over the
    # contiguous last dimensions: over middle ones, torch's reduction took almost as long as the kernel.
    parts = torch.empty([2, nheads, batch, nchunks], dtype=torch.float32, device=dt_hl.device)
    block_h = hl.register_block_size(nheads)
    block_q = helion.next_power_of_2(chunk_size)
    for tile_b, tile_c, tile_h in hl.tile([batch, nchunks, nheads], block_size=[1, 1, block_h]):
        b = tile_b.begin
        c = tile_c.begin
        for tile_q in hl.tile(chunk_size, block_size=block_q):
            pos = c * chunk_size + tile_q.index
            valid = pos < seqlen
            pre = hl.load(dt_hl, [b, tile_h, pos], extra_mask=valid[None, :]).to(torch.float32)
            if dt_bias is not None:
                pre = pre + dt_bias[tile_h].to(torch.float32)[:, None]
            soft = pre
            if dt_softplus:
                soft = fastmath.softplus(pre)
            if ddA is not None:
                dA_hq = ddA[b, tile_h, c, tile_q].to(torch.float32)
            else:
                # ddA_prev[t] = sum over u >= t of prev[u] = total - (its exclusive prefix sum), so one
                # exclusive prefix sum of (intra + next - prev) steps gives the three terms together.
                prev = torch.sum(prev_parts[b, tile_h, c, tile_q, :], dim=2)
                steps = torch.sum(intra_steps[b, tile_h, c, tile_q, :], dim=2) + torch.sum(
                    next_steps[b, tile_h, c, tile_q, :], dim=2) - prev
                total = torch.sum(prev, dim=1) + chunk_grad[b, tile_h, c]
                dA_hq = torch.cumsum(steps, dim=1) - steps + total[:, None]
            dA_v = torch.where(valid[None, :], dA_hq, 0.0)
            g = dA_v * A[tile_h].to(torch.float32)[:, None] + ddt_out[b, tile_h, c, tile_q].to(torch.float32)
            g = torch.where((soft < dt_min) | (soft > dt_max), 0.0, g)
            if dt_softplus:
                g = torch.where(pre <= fastmath.SOFTPLUS_THRESHOLD, g * fastmath.sigmoid(pre), g)
            g = torch.where(valid[None, :], g, 0.0)
            hl.store(ddt_hl, [b, tile_h, pos], g.to(ddt_hl.dtype), extra_mask=valid[None, :])
            clamped = torch.where(soft < dt_min, dt_min, soft)
            clamped = torch.where(clamped > dt_max, dt_max, clamped)
            parts[0, tile_h, b, c] = torch.sum(dA_v * clamped, dim=1)
            parts[1, tile_h, b, c] = torch.sum(g, dim=1)
    return parts


def chunk_cumsum_bwd(ddA, ddt_out, dt, A, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf")), ddt=None):
    """Same arguments and results as mamba-ssm's ``_chunk_cumsum_bwd``: (ddt (b, L, h) dt.dtype, dA (h)
    fp32, ddt_bias (h) fp32 or None). A given ``ddt`` (dt's shape and dtype, any strides) is filled by the
    kernel and returned."""
    assert ddA.shape == ddt_out.shape
    return _chunk_cumsum_bwd(ddA, (None,) * 4, ddt_out, dt, A, dt_bias, dt_softplus, dt_limit, ddt)


def chunk_cumsum_bwd_of_terms(intra_steps, next_steps, prev_parts, chunk_grad, ddt_out, dt, A, dt_bias=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf")), ddt=None):
    """``chunk_cumsum_bwd`` of ddA = ddA_intra + ddA_next + ddA_prev (``naive.combine_ddA_terms``), from
    the terms as the dCB, dB and dC stages give them ``unfinished``: their partials, which this kernel sums,
    prefix-sums and adds, in place of about a dozen PyTorch ops over the (b, h, c, Q) terms."""
    term_shape = tuple(ddt_out.shape)
    for name, part in (("intra_steps", intra_steps), ("next_steps", next_steps), ("prev_parts", prev_parts)):
        assert part.dim() == 5 and part.shape[:4] == term_shape, f"{name}: expected {term_shape} + (k,)"
    assert chunk_grad.shape == term_shape[:3]
    return _chunk_cumsum_bwd(None, (intra_steps, next_steps, prev_parts, chunk_grad), ddt_out, dt, A, dt_bias,
                             dt_softplus, dt_limit, ddt)


def _chunk_cumsum_bwd(ddA, terms, ddt_out, dt, A, dt_bias, dt_softplus, dt_limit, ddt):
    batch, seqlen, nheads = dt.shape
    assert A.shape == (nheads,) and ddt_out.shape[:2] == (batch, nheads)
    if dt_bias is not None:
        assert dt_bias.shape == (nheads,)
    check_out("ddt", ddt, dt.shape, dt.dtype)
    out = empty_dense(dt) if ddt is None else ddt
    parts = chunk_cumsum_bwd_kernel(ddA, *terms, ddt_out, dt.transpose(1, 2), A, dt_bias, out.transpose(1, 2),
                                    bool(dt_softplus), float(dt_limit[0]), float(dt_limit[1]))
    dA, ddt_bias = parts.sum(dim=(2, 3))
    ddt_bias = ddt_bias if dt_bias is not None else None
    return out, dA, ddt_bias
