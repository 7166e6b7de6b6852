"""Causal depthwise conv1d in Helion, forward and backward, with ``causal_conv1d.causal_conv1d_fn``'s
semantics (the references are in ``mamba2_kernels/conv/naive.py``):

    out[b, d, t] = act(bias[d] + sum_k weight[d, k] * x[b, d, t - (width - 1 - k)])

x (batch, dim, seqlen), contiguous or channels last (a transposed view of (batch, seqlen, dim) memory, the
layout Mamba2 hands over: no copy is made, outputs keep x's layout, and the layout is in the shape key since
it decides which tile dimension must be long), weight (dim, width) with width 2..4, optional bias
(dim,), optional seq_idx (batch, seqlen) int: a tap never reads across a change of sequence index.
activation None or "silu"/"swish". The causal left padding is done by masked loads inside the kernels.

Backward: each program owns a (batch, channel block, time span) and walks the span one time step at a
time, carrying x and g = dout * act'(pre) of the last three steps in registers. So each x and dout value is
read once and each sigmoid computed once; dx[t-3] is complete (it needs g up to t) and stored three steps
late, and the walk goes three steps past the span for it. A time tile instead needs the shifted g's, which
a register tile cannot give: the earlier tiled kernel recomputed the pre-activation at every shift (four
sigmoids per element) and ran at a small fraction of copy bandwidth. dweight and dbias accumulate in
registers and leave as one fp32 partial per (batch, span), summed on the host: deterministic, no atomics.
Span and channel block are tuned; channels last (Mamba2's layout) wants long channel blocks.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from mamba2_kernels import _fastmath as fastmath
from mamba2_kernels._buffers import check_out
from mamba2_kernels._ops import placed, present
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey, tokens_bucket

__all__ = ["causal_conv1d_fwd", "causal_conv1d_bwd", "causal_conv1d_fn", "causal_conv1d_fwd_kernel",
           "causal_conv1d_bwd_kernel"]

ACTIVATIONS = (None, "silu", "swish")


def _channels_last(x: torch.Tensor) -> bool:
    """True for Mamba2's layout: x is (batch, seqlen, dim) memory seen as (batch, dim, seqlen)."""
    return x.stride(2) != 1


def _key(x, weight, bias, seq_idx, silu) -> ShapeKey:
    # Every argument that changes the generated code is in the key, so one key never mixes variants; the
    # layout decides which tile dimension must be long for coalesced access. Channels and tokens set the
    # grid the blocks trade against (the backward's blocks tuned at one channel count ran far slower than
    # causal-conv1d at another); both are scaled fields (nearest lookup).
    return ShapeKey.of(dtype=str(x.dtype).removeprefix("torch."), width=int(weight.shape[1]),
                       bias=int(bias is not None), silu=int(bool(silu)), seq_idx=int(seq_idx is not None),
                       channels_last=int(_channels_last(x)), channels=int(x.shape[1]),
                       tokens=tokens_bucket(x.shape[0] * x.shape[2]))


def _fwd_key(x, weight, bias, seq_idx, out, silu) -> ShapeKey:
    return _key(x, weight, bias, seq_idx, silu)


def _bwd_key(x, weight, bias, dout, seq_idx, dx, silu) -> ShapeKey:
    return _key(x, weight, bias, seq_idx, silu)


# Autotuner seeds: channels-last inputs want long channel tiles, contiguous ones long time tiles. The
# backward's walk unrolled by 2-4 steps turns the window's register moves into renames (a fifth fewer
# instructions per step in its SASS for sm_90).
_FWD_SEEDS = [{"block_sizes": [1, d, t], "num_warps": w} for d, t, w in
              ((128, 32, 4), (64, 64, 4), (256, 16, 8), (32, 128, 4), (16, 256, 4))]
_BWD_SEEDS = [{"block_sizes": [span, d], "num_warps": w, "range_unroll_factors": [0, unroll]}
              for span, d, w, unroll in
              ((256, 512, 2, 4), (128, 512, 4, 4), (256, 256, 2, 4), (128, 256, 2, 2), (64, 512, 4, 4),
               (256, 256, 4, 0), (512, 256, 4, 0), (128, 512, 4, 0), (256, 1024, 8, 0), (1024, 128, 4, 0),
               (64, 256, 2, 0), (512, 32, 4, 0))]


@tuned_kernel(name="causal_conv1d_fwd", shape_key=_fwd_key, seeds=_FWD_SEEDS)
def causal_conv1d_fwd_kernel(
    x: torch.Tensor,  # (batch, dim, seqlen)
    weight: torch.Tensor,  # (dim, width)
    bias: torch.Tensor | None,  # (dim,)
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int32
    out: torch.Tensor,  # (batch, dim, seqlen), written
    silu: hl.constexpr,
) -> torch.Tensor:
    B, D, L = x.size()
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32  # compute dtype
    W = hl.specialize(weight.size(1))
    for tile_b, tile_d, tile_t in hl.tile([B, D, L]):
        acc = hl.zeros([tile_b, tile_d, tile_t], dtype=cdt)
        if bias is not None:
            acc = acc + bias[tile_d].to(cdt)[None, :, None]
        if seq_idx is not None:
            seq_here = seq_idx[tile_b, tile_t]
        for k in hl.static_range(W):
            src = tile_t.index - (W - 1 - k)
            xs = hl.load(x, [tile_b, tile_d, src], extra_mask=(src >= 0)[None, None, :]).to(cdt)
            if seq_idx is not None:
                seq_src = hl.load(seq_idx, [tile_b, src], extra_mask=(src >= 0)[None, :])
                xs = torch.where((seq_src == seq_here)[:, None, :], xs, 0.0)
            acc = acc + weight[tile_d, k].to(cdt)[None, :, None] * xs
        if silu:
            acc = acc * fastmath.sigmoid(acc)
        out[tile_b, tile_d, tile_t] = acc.to(out.dtype)
    return out


@tuned_kernel(name="causal_conv1d_bwd", shape_key=_bwd_key, partial_sums={1: 0, 2: 0}, seeds=_BWD_SEEDS)
def causal_conv1d_bwd_kernel(
    x: torch.Tensor,  # (batch, dim, seqlen)
    weight: torch.Tensor,  # (dim, width)
    bias: torch.Tensor | None,  # (dim,)
    dout: torch.Tensor,  # (batch, dim, seqlen)
    seq_idx: torch.Tensor | None,  # (batch, seqlen) int32
    dx: torch.Tensor,  # (batch, dim, seqlen), written
    silu: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, D, L = x.size()
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32  # compute dtype
    W = hl.specialize(weight.size(1))
    span_block = hl.register_block_size(L)  # time one program walks, one dweight/dbias partial each
    nspans = helion.cdiv(L, span_block)
    # Per (batch, span) partial sums, channels last so that their stores are contiguous.
    dw_part = torch.empty([B * nspans, 4, D], dtype=cdt, device=x.device)
    db_part = torch.empty([B * nspans, D], dtype=cdt, device=x.device)
    for tile_b, tile_d, tile_span in hl.tile([B, D, L], block_size=[1, None, span_block]):
        b = tile_b.begin
        part = b * nspans + tile_span.id
        start = tile_span.begin
        end = tile_span.end
        # Taps right-aligned to four: w3 multiplies x[t], w2 x[t-1], ...; absent taps are zero. Every carried
        # value gets its own hl.zeros: values started from one shared tensor are given one name in the code.
        w0 = hl.zeros([tile_d], dtype=cdt)
        w1 = hl.zeros([tile_d], dtype=cdt)
        pre_bias = hl.zeros([tile_d], dtype=cdt)
        if W >= 4:
            w0 = weight[tile_d, W - 4].to(cdt)
        if W >= 3:
            w1 = weight[tile_d, W - 3].to(cdt)
        w2 = weight[tile_d, W - 2].to(cdt)
        w3 = weight[tile_d, W - 1].to(cdt)
        if bias is not None:
            pre_bias = bias[tile_d].to(cdt)
        # The window carried along the walk: x, g (dout times act'(pre)) and seq_idx at t-3, t-2, t-1. The walk
        # starts three steps early to fill it and goes three steps past the span, since dx[t-3] needs g up to t.
        x1 = hl.zeros([tile_d], dtype=cdt)
        x2 = hl.zeros([tile_d], dtype=cdt)
        x3 = hl.zeros([tile_d], dtype=cdt)
        g1 = hl.zeros([tile_d], dtype=cdt)
        g2 = hl.zeros([tile_d], dtype=cdt)
        g3 = hl.zeros([tile_d], dtype=cdt)
        acc_db = hl.zeros([tile_d], dtype=cdt)
        acc_w0 = hl.zeros([tile_d], dtype=cdt)
        acc_w1 = hl.zeros([tile_d], dtype=cdt)
        acc_w2 = hl.zeros([tile_d], dtype=cdt)
        acc_w3 = hl.zeros([tile_d], dtype=cdt)
        if seq_idx is not None:
            no_seq = hl.zeros([tile_d], dtype=seq_idx.dtype)
            s1 = hl.zeros([tile_d], dtype=seq_idx.dtype)
            s2 = hl.zeros([tile_d], dtype=seq_idx.dtype)
            s3 = hl.zeros([tile_d], dtype=seq_idx.dtype)
        for step in hl.tile(start - 3, end + 3, block_size=1):
            # One time step; (channels, 1) tiles are summed over their one column into carried vectors.
            pos = step.index
            inside = (pos >= 0) & (pos < L)
            xt = torch.sum(hl.load(x, [b, tile_d, step], extra_mask=inside[None, :]).to(cdt), dim=1)
            gt = torch.sum(hl.load(dout, [b, tile_d, step], extra_mask=inside[None, :]).to(cdt), dim=1)
            t1, t2, t3 = x1, x2, x3  # the taps of pre[t], zero across a sequence boundary
            if seq_idx is not None:
                st_row = no_seq[:, None] + hl.load(seq_idx, [b, step], extra_mask=inside)[None, :]
                st = torch.sum(st_row, dim=1).to(seq_idx.dtype)
                t1 = torch.where(s1 == st, x1, 0.0)
                t2 = torch.where(s2 == st, x2, 0.0)
                t3 = torch.where(s3 == st, x3, 0.0)
            if silu:
                pre = pre_bias + w0 * t1 + w1 * t2 + w2 * t3 + w3 * xt
                sig = fastmath.sigmoid(pre)
                gt = gt * sig * (1.0 + pre * (1.0 - sig))
            own = torch.where((pos >= start) & (pos < end), 1.0, 0.0)  # outside: the neighbours' steps
            g_own = torch.sum(gt[:, None] * own[None, :], dim=1)
            acc_db = acc_db + g_own
            acc_w0 = acc_w0 + g_own * t1
            acc_w1 = acc_w1 + g_own * t2
            acc_w2 = acc_w2 + g_own * t3
            acc_w3 = acc_w3 + g_own * xt
            if seq_idx is not None:  # g at t-3+s reaches x[t-3] only within its sequence
                dx1 = w3 * g1 + w2 * torch.where(s2 == s1, g2, 0.0) + w1 * torch.where(s3 == s1, g3, 0.0)
                dx1 = dx1 + w0 * torch.where(st == s1, gt, 0.0)
                s1, s2, s3 = s2, s3, st
            else:
                dx1 = w3 * g1 + w2 * g2 + w1 * g3 + w0 * gt
            back = pos - 3
            stored = (back >= start) & (back < L)
            hl.store(dx, [b, tile_d, back], dx1[:, None].to(dx.dtype), extra_mask=stored[None, :])
            x1, x2, x3 = x2, x3, xt
            g1, g2, g3 = g2, g3, gt
        db_part[part, tile_d] = acc_db
        dw_part[part, 0, tile_d] = acc_w0
        dw_part[part, 1, tile_d] = acc_w1
        dw_part[part, 2, tile_d] = acc_w2
        dw_part[part, 3, tile_d] = acc_w3
    return dx, dw_part, db_part


def _readable(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels read it: as it is in either layout they read coalesced, else a contiguous copy. The fake
    functions apply it too, so that they promise the layout the kernels' outputs follow."""
    return x if x.stride(2) == 1 or x.stride(1) == 1 else x.contiguous()


def _prepare(x, weight, bias, seq_idx, activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    if x.dim() != 3:
        raise ValueError(f"x: expected (batch, dim, seqlen), got shape {tuple(x.shape)}")
    batch, dim, seqlen = x.shape
    if weight.dim() != 2 or weight.shape[0] != dim or not 2 <= weight.shape[1] <= 4:
        raise ValueError(f"weight: expected (dim={dim}, width in 2..4), got shape {tuple(weight.shape)}")
    if bias is not None and bias.shape != (dim,):
        raise ValueError(f"bias: expected shape ({dim},), got {tuple(bias.shape)}")
    x = _readable(x)
    weight = weight.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if seq_idx is not None:
        if seq_idx.shape != (batch, seqlen):
            raise ValueError(f"seq_idx: expected shape ({batch}, {seqlen}), got {tuple(seq_idx.shape)}")
        seq_idx = seq_idx.to(torch.int32).contiguous()
    return x, weight, bias, seq_idx, activation is not None


def _empty_like_layout(x: torch.Tensor) -> torch.Tensor:
    """A dense (batch, dim, seqlen) tensor in x's layout, also when x is a strided view (Mamba2's xBC)."""
    batch, dim, seqlen = x.shape
    if _channels_last(x):
        return torch.empty((batch, seqlen, dim), dtype=x.dtype, device=x.device).transpose(1, 2)
    return torch.empty((batch, dim, seqlen), dtype=x.dtype, device=x.device)


def causal_conv1d_fwd(x, weight, bias=None, seq_idx=None, activation=None):
    """The convolution, in x's layout: (batch, dim, seqlen) contiguous, or channels last as Mamba2 hands
    it (a transposed view of (batch, seqlen, dim) memory)."""
    x, weight, bias, seq_idx, silu = _prepare(x, weight, bias, seq_idx, activation)
    return causal_conv1d_fwd_kernel(x, weight, bias, seq_idx, _empty_like_layout(x), silu)


def _as_channels_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(1) == 1 else t.transpose(1, 2).contiguous().transpose(1, 2)


def causal_conv1d_bwd(x, weight, bias, dout, seq_idx=None, activation=None, dx=None):
    """(dx, dweight, dbias); dbias is None when bias is None. dx comes back channels last, or in ``dx`` (a
    (batch, dim, seqlen) tensor with stride 1 over dim, such as a slice of the layer's input gradient).

    The kernel walks time with channels as the vector, so x and dout are read channels last: Mamba2's
    layout as it is, other layouts through a transposed copy (walking contiguous memory, with time as the
    vector's stride, was many times slower than the copy and a channels-last walk)."""
    x, weight, bias, seq_idx, silu = _prepare(x, weight, bias, seq_idx, activation)
    if dout.shape != x.shape:
        raise ValueError(f"dout: expected shape {tuple(x.shape)}, got {tuple(dout.shape)}")
    x, dout = _as_channels_last(x), _as_channels_last(dout)
    check_out("dx", dx, x.shape, x.dtype, unit_stride_dim=1)
    if dx is None:
        dx = _empty_like_layout(x)
    dx, dw_part, db_part = causal_conv1d_bwd_kernel(x, weight, bias, dout, seq_idx, dx, silu)
    dweight = dw_part.sum(0)[4 - weight.shape[1]:].t().to(weight.dtype)  # taps right-aligned
    dbias = db_part.sum(0).to(bias.dtype) if bias is not None else None
    return dx, dweight, dbias


@torch.library.custom_op("mamba2_kernels::causal_conv1d_fwd", mutates_args=())
def _conv_fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None,
                 activation: str | None) -> torch.Tensor:
    """The convolution as one operator torch.compile keeps whole; out in x's layout."""
    return causal_conv1d_fwd(x, weight, bias, seq_idx, activation)


@_conv_fwd_op.register_fake
def _conv_fwd_fake(x, weight, bias, seq_idx, activation):
    return _empty_like_layout(_readable(x))


def _conv_setup_context(ctx, inputs, output):
    x, weight, bias, seq_idx, activation = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx)
    ctx.activation = activation


def _conv_backward(ctx, dout):
    x, weight, bias, seq_idx = ctx.saved_tensors
    dx, dweight, *dbias = torch.ops.mamba2_kernels.causal_conv1d_bwd(x, weight, bias, dout, seq_idx, ctx.activation)
    return dx, dweight, *placed(dbias, (bias,)), None, None


_conv_fwd_op.register_autograd(_conv_backward, setup_context=_conv_setup_context)


@torch.library.custom_op("mamba2_kernels::causal_conv1d_bwd", mutates_args=())
def _conv_bwd_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dout: torch.Tensor,
                 seq_idx: torch.Tensor | None, activation: str | None) -> list[torch.Tensor]:
    """[dx channels last, dweight, and dbias when bias is given]."""
    dx, dweight, dbias = causal_conv1d_bwd(x, weight, bias, dout, seq_idx, activation)
    return [dx, dweight.contiguous(), *present([dbias])]


@_conv_bwd_op.register_fake
def _conv_bwd_fake(x, weight, bias, dout, seq_idx, activation):
    return [_empty_like_layout(_as_channels_last(x)), torch.empty_like(weight),
            *present([torch.empty_like(bias) if bias is not None else None])]


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, activation=None):
    """Drop-in for ``causal_conv1d.causal_conv1d_fn`` (no initial/final states), differentiable."""
    x, weight, bias, seq_idx, _ = _prepare(x, weight, bias, seq_idx, activation)
    return torch.ops.mamba2_kernels.causal_conv1d_fwd(x, weight, bias, seq_idx, activation)
