"""Pure-PyTorch reference of the causal depthwise conv1d, with ``causal_conv1d.causal_conv1d_fn``'s
semantics: x (batch, dim, seqlen), weight (dim, width), optional bias (dim,), optional seq_idx
(batch, seqlen) so that taps never cross a sequence boundary, activation None or "silu".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = (None, "silu", "swish")


def causal_conv1d_fwd(x, weight, bias=None, seq_idx=None, activation=None):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected None or 'silu', got {activation!r}")
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    padded = F.pad(x, (width - 1, 0))
    out = torch.zeros_like(x) if bias is None else bias[None, :, None].expand_as(x).clone()
    for k in range(width):
        tap = padded[..., k:k + seqlen]
        shift = width - 1 - k  # this tap reads x[t - shift]
        if seq_idx is not None and shift:
            source = F.pad(seq_idx, (shift, 0), value=-1)[..., :seqlen]
            tap = tap * (source == seq_idx)[:, None, :]
        out = out + weight[None, :, k, None] * tap
    return F.silu(out) if activation in ("silu", "swish") else out


def causal_conv1d_bwd(x, weight, bias, dout, seq_idx=None, activation=None):
    """(dx, dweight, dbias) by autograd through ``causal_conv1d_fwd``."""
    return _grads(causal_conv1d_fwd, x, weight, bias, dout, seq_idx, activation)


def causal_conv1d_cuda_bwd(x, weight, bias, dout, seq_idx=None, activation=None):
    """The causal-conv1d package's CUDA backward kernel alone (as its autograd Function calls it), when that
    package is installed; dweight and dbias come back in the weights' dtype, as autograd gives them."""
    from causal_conv1d.cpp_functions import causal_conv1d_bwd_function

    dx, dweight, dbias, _ = causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx, None, None, None, False,
                                                       activation in ("silu", "swish"))
    return dx, dweight.to(weight.dtype), dbias.to(bias.dtype) if bias is not None else None


def _grads(conv, x, weight, bias, dout, seq_idx, activation):
    leaves = [t.detach().requires_grad_(True) if t is not None else None for t in (x, weight, bias)]
    with torch.enable_grad():
        out = conv(leaves[0], leaves[1], leaves[2], seq_idx=seq_idx, activation=activation)
        wanted = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(out, wanted, dout))
    return tuple(next(grads) if t is not None else None for t in leaves)
