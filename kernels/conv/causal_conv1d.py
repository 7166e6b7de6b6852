"""Causal depthwise conv1d in Helion, forward and backward, with ``causal_conv1d.causal_conv1d_fn``'s
semantics (the references are in ``kernels/conv/naive.py``):

    out[b, d, t] = act(bias[d] + sum_k weight[d, k] * x[b, d, t - (width - 1 - k)])

x (batch, dim, seqlen), contiguous or channels last (a transposed view of (batch, seqlen, dim) memory, the
layout Mamba2 hands over: no copy is made, outputs keep x's layout, and the layout is in the shape key since
it decides which tile dimension must be long), weight (dim, width) with width 2..4, optional bias
(dim,), optional seq_idx (batch, seqlen) int: a tap never reads across a change of sequence index.
activation None or "silu"/"swish". The causal left padding is done by masked loads inside the kernels.

Backward: each program owns a (batch, dim tile, time span) block and walks the span in time tiles. Per tile
it loads the 2*width-1 shifted x tiles once, recomputes the pre-activation at t + s for s = 0..width-1 from
them, forms g = dout * act'(pre), writes dx[t] = sum_s weight[width-1-s] * g[t+s], and accumulates dweight
and dbias in registers. They leave as one fp32 partial per (batch, span), summed on the host:
deterministic, no atomics, and few enough that the sum is cheap (a partial per time tile cost 0.5 ms at
nemotron3-nano on the H200). Span, tile and channel block are tuned.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from kernels._runtime import tuned_kernel
from kernels.config_store import ShapeKey, tokens_bucket

__all__ = ["causal_conv1d_fwd", "causal_conv1d_bwd", "causal_conv1d_fn", "causal_conv1d_fwd_kernel",
           "causal_conv1d_bwd_kernel"]

ACTIVATIONS = (None, "silu", "swish")


def _channels_last(x: torch.Tensor) -> bool:
    """True for Mamba2's layout: x is (batch, seqlen, dim) memory seen as (batch, dim, seqlen)."""
    return x.stride(2) != 1


def _key(x, weight, bias, seq_idx, silu) -> ShapeKey:
    # Every argument that changes the generated code is in the key, so one key never mixes variants; the
    # layout decides which tile dimension must be long for coalesced access.
    return ShapeKey.of(dtype=str(x.dtype).removeprefix("torch."), width=int(weight.shape[1]),
                       bias=int(bias is not None), silu=int(bool(silu)), seq_idx=int(seq_idx is not None),
                       channels_last=int(_channels_last(x)), tokens=tokens_bucket(x.shape[0] * x.shape[2]))


def _fwd_key(x, weight, bias, seq_idx, out, silu) -> ShapeKey:
    return _key(x, weight, bias, seq_idx, silu)


def _bwd_key(x, weight, bias, dout, seq_idx, dx, silu) -> ShapeKey:
    return _key(x, weight, bias, seq_idx, silu)


# Autotuner seeds: channels-last inputs want long channel tiles, contiguous ones long time tiles.
_FWD_SEEDS = [{"block_sizes": [1, d, t], "num_warps": w} for d, t, w in
              ((128, 32, 4), (64, 64, 4), (256, 16, 8), (32, 128, 4), (16, 256, 4))]
_BWD_SEEDS = [{"block_sizes": [span, t, d], "num_warps": w} for span, t, d, w in
              ((512, 16, 128, 4), (1024, 8, 128, 4), (256, 32, 64, 4), (512, 8, 256, 8), (1024, 64, 32, 4),
               (2048, 128, 16, 4))]


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
            acc = acc * torch.sigmoid(acc)
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
    t_block = hl.register_block_size(L)  # time rows per step of that walk
    nspans = helion.cdiv(L, span_block)
    # Per (batch, span) partial sums, channels last so that their stores are contiguous.
    dw_part = torch.empty([B * nspans, 4, D], dtype=cdt, device=x.device)
    db_part = torch.empty([B * nspans, D], dtype=cdt, device=x.device)
    for tile_b, tile_d, tile_span in hl.tile([B, D, L], block_size=[1, None, span_block]):
        b = tile_b.begin
        part = b * nspans + tile_span.id
        acc_db = hl.zeros([tile_d], dtype=cdt)
        acc_w0 = hl.zeros([tile_d], dtype=cdt)
        acc_w1 = hl.zeros([tile_d], dtype=cdt)
        acc_w2 = hl.zeros([tile_d], dtype=cdt)
        acc_w3 = hl.zeros([tile_d], dtype=cdt)
        for tile_t in hl.tile(tile_span.begin, tile_span.end, block_size=t_block):
            # Every tap the pre-activations at t .. t+W-1 read: x at t+o, o = -(W-1) .. W-1, loaded once.
            filler = hl.zeros([tile_d, tile_t], dtype=x.dtype)
            xs = [filler, filler, filler, filler, filler, filler, filler]
            for j in hl.static_range(2 * W - 1):
                src = tile_t.index + (j - (W - 1))
                xs[j] = hl.load(x, [b, tile_d, src], extra_mask=((src >= 0) & (src < L))[None, :])
            if seq_idx is not None:
                no_seq = hl.zeros([tile_t], dtype=seq_idx.dtype)
                seqs = [no_seq, no_seq, no_seq, no_seq, no_seq, no_seq, no_seq]
                for j in hl.static_range(2 * W - 1):
                    src = tile_t.index + (j - (W - 1))
                    seqs[j] = hl.load(seq_idx, [b, src], extra_mask=(src >= 0) & (src < L))
            # x taps of dweight (x at t - (W-1-k)), as the sequence mask leaves them
            taps = [filler.to(cdt), filler.to(cdt), filler.to(cdt), filler.to(cdt)]
            for k in hl.static_range(W):
                taps[k] = xs[k].to(cdt)
                if seq_idx is not None:
                    taps[k] = torch.where((seqs[k] == seqs[W - 1])[None, :], taps[k], 0.0)
            acc_dx = hl.zeros([tile_d, tile_t], dtype=cdt)
            for s in hl.static_range(W):
                # g = dout * act'(pre) at t + s (zero past the end), and its contribution to dx[t]
                pos = tile_t.index + s
                g = hl.load(dout, [b, tile_d, pos], extra_mask=(pos < L)[None, :]).to(cdt)
                if silu:
                    pre = hl.zeros([tile_d, tile_t], dtype=cdt)
                    if bias is not None:
                        pre = pre + bias[tile_d].to(cdt)[:, None]
                    for k in hl.static_range(W):
                        tap = xs[s + k].to(cdt)
                        if seq_idx is not None:
                            tap = torch.where((seqs[s + k] == seqs[s + W - 1])[None, :], tap, 0.0)
                        pre = pre + weight[tile_d, k].to(cdt)[:, None] * tap
                    sig = torch.sigmoid(pre)
                    g = g * sig * (1.0 + pre * (1.0 - sig))
                if seq_idx is not None:
                    g = torch.where((seqs[s + W - 1] == seqs[W - 1])[None, :], g, 0.0)
                acc_dx = acc_dx + weight[tile_d, W - 1 - s].to(cdt)[:, None] * g
                if s == 0:
                    acc_db = acc_db + torch.sum(g, dim=1)
                    acc_w0 = acc_w0 + torch.sum(g * taps[0], dim=1)
                    acc_w1 = acc_w1 + torch.sum(g * taps[1], dim=1)
                    acc_w2 = acc_w2 + torch.sum(g * taps[2], dim=1)  # zero taps when W < 3
                    acc_w3 = acc_w3 + torch.sum(g * taps[3], dim=1)
            dx[b, tile_d, tile_t] = acc_dx.to(dx.dtype)
        db_part[part, tile_d] = acc_db
        dw_part[part, 0, tile_d] = acc_w0
        dw_part[part, 1, tile_d] = acc_w1
        dw_part[part, 2, tile_d] = acc_w2
        dw_part[part, 3, tile_d] = acc_w3
    return dx, dw_part, db_part


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
    if x.stride(2) != 1 and x.stride(1) != 1:  # neither layout the kernels read coalesced
        x = x.contiguous()
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


def causal_conv1d_bwd(x, weight, bias, dout, seq_idx=None, activation=None):
    """(dx, dweight, dbias); dbias is None when bias is None."""
    x, weight, bias, seq_idx, silu = _prepare(x, weight, bias, seq_idx, activation)
    if dout.shape != x.shape:
        raise ValueError(f"dout: expected shape {tuple(x.shape)}, got {tuple(dout.shape)}")
    if dout.stride(2) != 1 and dout.stride(1) != 1:
        dout = dout.contiguous()
    dx, dw_part, db_part = causal_conv1d_bwd_kernel(x, weight, bias, dout, seq_idx, _empty_like_layout(x), silu)
    dweight = dw_part.sum(0)[:weight.shape[1]].t().to(weight.dtype)
    dbias = db_part.sum(0).to(bias.dtype) if bias is not None else None
    return dx, dweight, dbias


class CausalConv1dFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias=None, seq_idx=None, activation=None):
        ctx.save_for_backward(x, weight, bias, seq_idx)
        ctx.activation = activation
        return causal_conv1d_fwd(x, weight, bias, seq_idx, activation)

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias, seq_idx = ctx.saved_tensors
        dx, dweight, dbias = causal_conv1d_bwd(x, weight, bias, dout, seq_idx, ctx.activation)
        return dx, dweight, dbias, None, None


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, activation=None):
    """Drop-in for ``causal_conv1d.causal_conv1d_fn`` (no initial/final states), differentiable."""
    return CausalConv1dFn.apply(x, weight, bias, seq_idx, activation)
