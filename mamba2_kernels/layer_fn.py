"""``mamba_split_conv1d_scan_combined``: the whole Mamba-2 layer after ``in_proj``, as a drop-in for mamba-ssm
2.3.2.post1's function of the same name (``mamba_ssm/ops/triton/ssd_combined.py``).

    zxbcdt -> split [zx0 (2*d_nonssm), z (dim), xBC (dim + 2*ngroups*dstate), dt (nheads)]
    xBC    -> causal conv1d (+ SiLU) -> x, B, C
    x, dt  -> SSD (dt_softplus=True, dt_bias, D, dt_limit, initial_states, seq_idx)
           -> gated RMSNorm with z (when ``rmsnorm_weight``), else the SSD's own z gate
    [swiglu(zx0), y] -> optional out_proj (F.linear)

The forward and backward are made of the Helion kernels: ``mamba2_kernels.conv.causal_conv1d`` (fwd/bwd),
``mamba2_kernels.ssd.combined.ssd_forward`` / ``ssd_backward`` (the SSD stages), ``mamba2_kernels.norm.gated_rmsnorm``
(fwd/bwd); out_proj is ``F.linear`` and the optional swiglu part (``d_nonssm > 0``) is plain PyTorch.

Recomputation follows mamba-ssm: the forward saves zxbcdt, the weights, the SSD's pre-gate output and the
norm's rstd; the backward recomputes the conv output (x, B, C) and, when out_proj is fused, the input of
out_proj (the norm output, or the z-gated SSD output), instead of saving them.

Under ``torch.compile`` the layer is ``mamba2_kernels.layer_compose`` over the public operators of its parts
(``OPERATOR_PARTS``: the conv, the SSD call and the gated norm, each a ``torch.library`` custom op): no graph
break, the split, the SwiGLU and out_proj left to Inductor; it then saves the conv output as the parts' own
backwards need it, rather than recomputing it.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F

from mamba2_kernels import _environ, layer_compose, seen
from mamba2_kernels.conv.causal_conv1d import causal_conv1d_bwd, causal_conv1d_fn, causal_conv1d_fwd
from mamba2_kernels.norm.gated_rmsnorm import gated_rmsnorm_bwd, gated_rmsnorm_fwd
from mamba2_kernels.norm.rmsnorm import rmsnorm_fn
from mamba2_kernels.ssd._keys import dtype_name
from mamba2_kernels.ssd.combined import (
    check_chunk_size,
    check_seq_idx,
    check_state_dtype,
    check_tensors,
    mamba_chunk_scan_combined,
    ssd_backward,
    ssd_forward,
)

__all__ = ["mamba_split_conv1d_scan_combined", "MambaSplitConv1dScanCombinedFn", "layer_dims"]

INF = float("inf")


def _ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit, state_dtype):
    return mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                     initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True,
                                     dt_limit=dt_limit, return_final_states=True, state_dtype=state_dtype)


def _norm(x, weight, eps, z, group_size, norm_before_gate):
    return rmsnorm_fn(x, weight, None, z=z, eps=eps, group_size=group_size, norm_before_gate=norm_before_gate)


OPERATOR_PARTS = types.SimpleNamespace(conv=causal_conv1d_fn, ssd=_ssd, norm=_norm)
ACTIVATIONS = (None, "silu", "swish")


def _custom_amp(decorator_name):
    # mamba-ssm wraps forward/backward in torch.amp.custom_fwd/custom_bwd(device_type="cuda").
    decorator = getattr(torch.amp, decorator_name)
    return decorator(device_type="cuda")


def _shape(t) -> object:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def layer_dims(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx, dt_limit,
               activation, rmsnorm_weight, outproj_weight, outproj_bias, headdim, ngroups):
    """Check the arguments (ValueError / NotImplementedError naming the argument); returns
    (batch, seqlen, nheads, headdim, ngroups, dstate, d_nonssm)."""
    if activation not in ACTIVATIONS:
        raise NotImplementedError(f"activation: only None, 'silu' and 'swish' are supported, got {activation!r}")
    if not (isinstance(zxbcdt, torch.Tensor) and zxbcdt.dim() == 3):
        raise ValueError(f"zxbcdt: expected (batch, seqlen, d_in_proj), got {_shape(zxbcdt)}")
    check_tensors(("zxbcdt", zxbcdt), conv1d_weight=conv1d_weight, conv1d_bias=conv1d_bias, dt_bias=dt_bias, A=A,
                  D=D, initial_states=initial_states, rmsnorm_weight=rmsnorm_weight, outproj_weight=outproj_weight,
                  outproj_bias=outproj_bias)
    batch, seqlen, width_in = zxbcdt.shape
    check_chunk_size(chunk_size)
    if not (isinstance(D, torch.Tensor) and D.dim() in (1, 2)):
        raise ValueError(f"D: expected (nheads,) or (nheads, headdim), got {_shape(D)}")
    if D.dim() == 1:
        if not (isinstance(headdim, int) and headdim > 0):
            raise ValueError(f"headdim: required (a positive int) when D is 1-D, got {headdim!r}")
        nheads = D.shape[0]
    else:
        nheads, d_headdim = D.shape
        if not (headdim is None or headdim == d_headdim):
            raise ValueError(f"headdim: {headdim} disagrees with D's shape {tuple(D.shape)}")
        headdim = d_headdim
    dim = nheads * headdim
    if not (isinstance(ngroups, int) and ngroups > 0 and nheads % ngroups == 0):
        raise ValueError(f"ngroups: expected a positive divisor of nheads ({nheads}), got {ngroups!r}")
    if not (isinstance(conv1d_weight, torch.Tensor) and conv1d_weight.dim() == 2):
        raise ValueError(f"conv1d_weight: expected (dim + 2*ngroups*dstate, width), got {_shape(conv1d_weight)}")
    conv_dim, width = conv1d_weight.shape
    if not (conv_dim > dim and (conv_dim - dim) % (2 * ngroups) == 0):
        raise ValueError(f"conv1d_weight: expected dim ({dim}) + 2*ngroups ({ngroups})*dstate rows, got {conv_dim}")
    if not 2 <= width <= 4:
        raise NotImplementedError(f"conv1d_weight: the causal conv1d supports widths 2..4, got {width}")
    dstate = (conv_dim - dim) // (2 * ngroups)
    rest = width_in - 2 * dim - 2 * ngroups * dstate - nheads
    if not (rest >= 0 and rest % 2 == 0):
        raise ValueError(f"zxbcdt: last dim {width_in} is not 2*d_nonssm + 2*dim ({2 * dim}) + 2*ngroups*dstate "
                         f"({2 * ngroups * dstate}) + nheads ({nheads})")
    d_nonssm = rest // 2
    if conv1d_bias is not None and tuple(conv1d_bias.shape) != (conv_dim,):
        raise ValueError(f"conv1d_bias: expected ({conv_dim},), got {_shape(conv1d_bias)}")
    if not (isinstance(dt_bias, torch.Tensor) and tuple(dt_bias.shape) == (nheads,)):
        raise ValueError(f"dt_bias: expected ({nheads},), got {_shape(dt_bias)}")
    if not (isinstance(A, torch.Tensor) and tuple(A.shape) == (nheads,)):
        raise ValueError(f"A: expected ({nheads},), got {_shape(A)}")
    if initial_states is not None:
        expected = (batch, nheads, headdim, dstate)
        if tuple(initial_states.shape) != expected:
            raise ValueError(f"initial_states: expected {expected}, got {_shape(initial_states)}")
    check_seq_idx(seq_idx, batch, seqlen, zxbcdt.device)
    if not (len(dt_limit) == 2 and dt_limit[0] <= dt_limit[1]):
        raise ValueError(f"dt_limit: expected (low, high) with low <= high, got {dt_limit!r}")
    if rmsnorm_weight is not None and tuple(rmsnorm_weight.shape) != (dim,):
        raise ValueError(f"rmsnorm_weight: expected ({dim},), got {_shape(rmsnorm_weight)}")
    if outproj_weight is not None:
        if not (outproj_weight.dim() == 2 and outproj_weight.shape[1] == d_nonssm + dim):
            raise ValueError(f"outproj_weight: expected (out_dim, {d_nonssm + dim}), got {_shape(outproj_weight)}")
        if outproj_bias is not None and tuple(outproj_bias.shape) != (outproj_weight.shape[0],):
            raise ValueError(f"outproj_bias: expected ({outproj_weight.shape[0]},), got {_shape(outproj_bias)}")
    elif outproj_bias is not None:
        raise ValueError("outproj_bias: given without outproj_weight")
    return batch, seqlen, nheads, headdim, ngroups, dstate, d_nonssm


def _split(zxbcdt, d_nonssm, dim, ngroups, dstate, nheads):
    return torch.split(zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)


def _conv(xBC, conv1d_weight, conv1d_bias, seq_idx, activation):
    """(b, L, d) -> conv (b, L, d), contiguous."""
    out = causal_conv1d_fwd(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx, activation)
    return out.transpose(1, 2).contiguous()


def _xbc(xBC_conv, dim, nheads, ngroups, dstate):
    x, B, C = torch.split(xBC_conv, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    return (x.unflatten(-1, (nheads, dim // nheads)), B.unflatten(-1, (ngroups, dstate)),
            C.unflatten(-1, (ngroups, dstate)))


def _swiglu_fwd(zx0):
    a, b = zx0.chunk(2, dim=-1)
    return F.silu(a) * b


def _swiglu_bwd(zx0, dout, dzx0):
    """Writes the gradient of zx0 into ``dzx0`` (its slice of the layer's input gradient)."""
    a, b = zx0.float().chunk(2, dim=-1)
    dout = dout.float()
    sig = torch.sigmoid(a)
    da, db = dzx0.chunk(2, dim=-1)
    da.copy_(dout * b * sig * (1 + a * (1 - sig)))
    db.copy_(dout * a * sig)


class MambaSplitConv1dScanCombinedFn(torch.autograd.Function):
    @staticmethod
    @_custom_amp("custom_fwd")
    def forward(ctx, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states=None, seq_idx=None,
                dt_limit=(0.0, INF), return_final_states=False, activation="silu", rmsnorm_weight=None,
                rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None, ngroups=1,
                norm_before_gate=True, state_dtype=None):
        batch, seqlen, nheads, headdim, ngroups, dstate, d_nonssm = layer_dims(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx, dt_limit,
            activation, rmsnorm_weight, outproj_weight, outproj_bias, headdim, ngroups)
        ctx.call = seen.current()
        dim = nheads * headdim
        seq_idx = seq_idx.contiguous() if seq_idx is not None else None
        zx0, z, xBC, dt = _split(zxbcdt, d_nonssm, dim, ngroups, dstate, nheads)
        x, B, C = _xbc(_conv(xBC, conv1d_weight, conv1d_bias, seq_idx, activation), dim, nheads, ngroups, dstate)
        z = z.unflatten(-1, (nheads, headdim))
        rstd = None
        if rmsnorm_weight is None:
            out, out_x, final_states = ssd_forward(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                                   initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True,
                                                   dt_limit=dt_limit, state_dtype=state_dtype)
            y = out.flatten(-2)
        else:
            out_x, _, final_states = ssd_forward(x, dt, A, B, C, chunk_size, D=D, z=None, dt_bias=dt_bias,
                                                 initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True,
                                                 dt_limit=dt_limit, state_dtype=state_dtype)
            rmsnorm_weight = rmsnorm_weight.contiguous()
            y, _, rstd = gated_rmsnorm_fwd(out_x.reshape(batch * seqlen, dim), rmsnorm_weight, None, rmsnorm_eps,
                                           z=z.reshape(batch * seqlen, dim), group_size=dim // ngroups,
                                           norm_before_gate=norm_before_gate)
            y = y.view(batch, seqlen, dim)
        if d_nonssm > 0:
            y = torch.cat([_swiglu_fwd(zx0), y.to(zx0.dtype)], dim=-1)
        if outproj_weight is not None:
            if torch.is_autocast_enabled("cuda"):
                dtype = torch.get_autocast_dtype("cuda")
                y, outproj_weight = y.to(dtype), outproj_weight.to(dtype)
                outproj_bias = outproj_bias.to(dtype) if outproj_bias is not None else None
            out = F.linear(y, outproj_weight, outproj_bias)
        else:
            out = y
        ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, initial_states, seq_idx,
                              rmsnorm_weight, rstd, outproj_weight, outproj_bias)
        ctx.dims = (nheads, headdim, ngroups, dstate, d_nonssm)
        ctx.chunk_size = chunk_size
        ctx.dt_limit = tuple(dt_limit)
        ctx.return_final_states = return_final_states
        ctx.activation = activation
        ctx.rmsnorm_eps = rmsnorm_eps
        ctx.norm_before_gate = norm_before_gate
        ctx.state_dtype = state_dtype
        return (out, final_states) if return_final_states else out

    @staticmethod
    @_custom_amp("custom_bwd")
    def backward(ctx, dout, *args):
        with _environ.read_once(), seen.calling(**ctx.call) if ctx.call else contextlib.nullcontext():
            return _backward(ctx, dout, *args)


def _backward(ctx, dout, *args):
    """``MambaSplitConv1dScanCombinedFn.backward``, inside its call's seen-keys context."""
    (zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight, rstd,
     outproj_weight, outproj_bias) = ctx.saved_tensors
    dfinal_states = args[0] if ctx.return_final_states else None
    nheads, headdim, ngroups, dstate, d_nonssm = ctx.dims
    dim = nheads * headdim
    batch, seqlen = zxbcdt.shape[:2]
    recompute_output = outproj_weight is not None
    zx0, z, xBC, dt = _split(zxbcdt, d_nonssm, dim, ngroups, dstate, nheads)
    # Recompute x, B, C: the conv output is not saved.
    x, B, C = _xbc(_conv(xBC, conv1d_weight, conv1d_bias, seq_idx, ctx.activation), dim, nheads, ngroups, dstate)
    z = z.unflatten(-1, (nheads, headdim))
    # As mamba-ssm: each gradient is written by its producer straight into its slice of the input gradient;
    # the SSD's dx, dB, dC go to one xBC-shaped buffer, which the conv backward reads.
    dzxbcdt = torch.empty(zxbcdt.shape, dtype=zxbcdt.dtype, device=zxbcdt.device)  # dense: slices are views
    dzx0, dz, dxBC_given, ddt_given = _split(dzxbcdt, d_nonssm, dim, ngroups, dstate, nheads)
    dxBC = torch.empty(xBC.shape, dtype=xBC.dtype, device=xBC.device)
    dx, dB, dC = _xbc(dxBC, dim, nheads, ngroups, dstate)
    ssd_grads = dict(dx=dx, ddt=ddt_given, dB=dB, dC=dC)
    dout_og = dout
    if outproj_weight is not None:
        dout = F.linear(dout, outproj_weight.t())
    y0 = None
    if d_nonssm > 0:
        dout0, dout = dout.split([d_nonssm, dim], dim=-1)
        _swiglu_bwd(zx0, dout0, dzx0)
        y0 = _swiglu_fwd(zx0) if recompute_output else None
    dout = dout.reshape(batch, seqlen, nheads, headdim)
    drmsnorm_weight = None
    y1 = None
    if rmsnorm_weight is None:
        _, _, dA, _, _, dD, _, ddt_bias, dinitial_states = ssd_backward(
            dout, x, dt, A, B, C, out_x, ctx.chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
            dfinal_states=dfinal_states, seq_idx=seq_idx, dt_softplus=True, dt_limit=ctx.dt_limit,
            dz=dz.unflatten(-1, (nheads, headdim)), state_dtype=ctx.state_dtype, **ssd_grads)
        if recompute_output:
            y1 = (out_x * F.silu(z.float())).to(out_x.dtype).flatten(-2)
    else:
        x_rms = out_x.reshape(batch * seqlen, dim)
        z_rms = z.reshape(batch * seqlen, dim)
        dy_rms, drmsnorm_weight, _, _ = gated_rmsnorm_bwd(
            dout.reshape(batch * seqlen, dim), x_rms, rmsnorm_weight, None, ctx.rmsnorm_eps, None, rstd, z_rms,
            group_size=dim // ngroups, norm_before_gate=ctx.norm_before_gate, dz=dz.view(batch * seqlen, dim))
        if recompute_output:  # the norm output is recomputed, not saved
            y1 = gated_rmsnorm_fwd(x_rms, rmsnorm_weight, None, ctx.rmsnorm_eps, z=z_rms, group_size=dim // ngroups,
                                   norm_before_gate=ctx.norm_before_gate)[0].view(batch, seqlen, dim)
        _, _, dA, _, _, dD, _, ddt_bias, dinitial_states = ssd_backward(
            dy_rms.view(batch, seqlen, nheads, headdim), x, dt, A, B, C, out_x, ctx.chunk_size, D=D, z=None,
            dt_bias=dt_bias, initial_states=initial_states, dfinal_states=dfinal_states, seq_idx=seq_idx,
            dt_softplus=True, dt_limit=ctx.dt_limit, state_dtype=ctx.state_dtype, **ssd_grads)
    doutproj_weight = doutproj_bias = None
    if outproj_weight is not None:
        y = y1 if y0 is None else torch.cat([y0, y1.to(y0.dtype)], dim=-1)
        out_dim = dout_og.shape[-1]
        doutproj_weight = dout_og.reshape(-1, out_dim).t().mm(y.reshape(-1, y.shape[-1]).to(dout_og.dtype))
        doutproj_bias = dout_og.sum(dim=(0, 1)) if outproj_bias is not None else None
    _, dweight, dbias = causal_conv1d_bwd(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, dxBC.transpose(1, 2),
                                          seq_idx, ctx.activation, dx=dxBC_given.transpose(1, 2))
    return (dzxbcdt, dweight, dbias, ddt_bias, dA, dD, None, dinitial_states, None, None, None, None,
            drmsnorm_weight, None, doutproj_weight, doutproj_bias, None, None, None, None)


def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                     initial_states=None, seq_idx=None, dt_limit=(0.0, INF), return_final_states=False,
                                     activation="silu", rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None,
                                     outproj_bias=None, headdim=None, ngroups=1, norm_before_gate=True,
                                     state_dtype=None):
    """Same signature and semantics as ``mamba_ssm.ops.triton.ssd_combined.mamba_split_conv1d_scan_combined``,
    with mamba-ssm's main-branch ``state_dtype`` (``mamba2_kernels.mamba_chunk_scan_combined`` says what it does).

    zxbcdt: (batch, seqlen, 2*d_nonssm + 2*dim + 2*ngroups*dstate + nheads), dim = nheads*headdim;
    conv1d_weight: (dim + 2*ngroups*dstate, width); conv1d_bias: (dim + 2*ngroups*dstate,) or None;
    dt_bias, A: (nheads,); D: (nheads, headdim) or (nheads,) (then ``headdim`` is required);
    initial_states: (batch, nheads, headdim, dstate); seq_idx: (batch, seqlen) int; rmsnorm_weight: (dim,);
    outproj_weight: (out_dim, d_nonssm + dim); outproj_bias: (out_dim,).
    norm_before_gate: True -> RMSNorm(x) * silu(z); False -> RMSNorm(x * silu(z)).
    Returns out (batch, seqlen, out_dim or d_nonssm + dim), and final_states (fp32) if ``return_final_states``.
    """
    dims = layer_dims(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx,
                      dt_limit, activation, rmsnorm_weight, outproj_weight, outproj_bias, headdim, ngroups)
    check_state_dtype(state_dtype)
    if torch.compiler.is_compiling():
        return layer_compose.mamba_split_conv1d_scan(
            OPERATOR_PARTS, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx,
            dt_limit, return_final_states, activation, rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias,
            headdim, ngroups, norm_before_gate, state_dtype)
    shape = layer_call_shape(dims, zxbcdt, conv1d_weight, D, chunk_size, initial_states, seq_idx, rmsnorm_weight,
                             norm_before_gate)
    with _environ.read_once(), seen.calling(**shape):
        return MambaSplitConv1dScanCombinedFn.apply(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                                    initial_states, seq_idx, tuple(dt_limit), return_final_states,
                                                    activation, rmsnorm_weight, rmsnorm_eps, outproj_weight,
                                                    outproj_bias, headdim, ngroups, norm_before_gate, state_dtype)


def layer_call_shape(dims, zxbcdt, conv1d_weight, D, chunk_size, initial_states, seq_idx, rmsnorm_weight,
                     norm_before_gate) -> dict:
    """The layer call as a suite shape (``mamba2_kernels/suites.yaml``'s fields, conv and norm included), for the
    seen-keys file: what ``mamba2-guard autotune --seen`` tunes with the layer. Packed documents count as 2."""
    batch, seqlen, nheads, headdim, ngroups, dstate, _ = dims
    pattern = {"z": rmsnorm_weight is None, "docs": 2 if seq_idx is not None else 1,  # z: into the SSD
               "D": "hp" if D.dim() == 2 else "h", "initial_states": initial_states is not None}
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": ngroups,
            "dstate": dstate, "chunk_size": chunk_size, "dtype": dtype_name(zxbcdt.dtype),
            "norm": {"group_size": nheads * headdim // ngroups, "norm_before_gate": bool(norm_before_gate)},
            "conv": {"width": conv1d_weight.shape[-1]}, "call": pattern}
