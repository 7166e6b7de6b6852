"""Pure-PyTorch references of mamba-ssm's SSD (Mamba-2 chunked scan) kernels.

Each stage function has the signature, argument semantics, output tuple and output shapes of the
mamba-ssm wrapper named in its docstring (``mamba_ssm/ops/triton/ssd_*.py``). They run on any device.

Dtypes: the math runs in the widest floating input dtype, at least fp32. Outputs take the dtype that
mamba-ssm gives them, except that every output stays fp64 when the inputs are fp64.
Arguments that mamba-ssm writes into (``out=``, ``dx=``, ``dz=``, ``ddt=``) are ignored: fresh tensors
are returned.

Shape letters: b batch, L seqlen, h nheads, p headdim, g ngroups, n dstate, c nchunks, Q chunk_size.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from mamba2_kernels.ssd import compose
from mamba2_kernels.ssd._keys import exclusive_cumsum

__all__ = [
    "chunk_cumsum_fwd",
    "chunk_state_fwd",
    "state_passing_fwd",
    "chunk_state_passing_fwd",
    "chunk_cumsum_state_passing_fwd",
    "chunk_state_varlen",
    "chunk_state_varlen_bwd",
    "bmm_chunk_fwd",
    "chunk_scan_fwd",
    "bmm_chunk_scan_fwd",
    "chunk_state_passing_scan_fwd",
    "ssd_fwd",
    "chunk_scan_bwd_dz",
    "chunk_scan_bwd_dstates",
    "state_passing_bwd",
    "chunk_state_passing_bwd",
    "chunk_scan_chunk_state_bwd_dx",
    "chunk_state_bwd_db",
    "chunk_scan_bwd_dC",
    "chunk_scan_bwd_dcb",
    "bmm_chunk_scan_bwd_dcb",
    "bmm_chunk_bwd",
    "chunk_bwd_db_dc",
    "chunk_scan_bwd_ddAcs_stable",
    "chunk_cumsum_bwd",
    "combine_ddA_terms",
    "chunk_cumsum_bwd_of_terms",
    "chunk_cumsum_bwd_of_partial_terms",
    "ssd_chunked_ref",
    "ssd_chunked_bwd_ref",
    "ssd_recurrent_ref",
]


# ----------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------


def _cdtype(*tensors) -> torch.dtype:
    """Compute dtype: the widest floating input dtype, at least fp32."""
    dtype = torch.float32
    for t in tensors:
        if t is not None and t.is_floating_point():
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _odtype(mamba_dtype: torch.dtype, cdtype: torch.dtype) -> torch.dtype:
    """Output dtype: mamba-ssm's, but fp64 runs stay fp64."""
    return torch.float64 if cdtype == torch.float64 else mamba_dtype


def _chunk(t: torch.Tensor, chunk_size: int, value: float = 0.0) -> torch.Tensor:
    """(b, L, ...) -> (b, c, Q, ...), padding the last chunk with ``value``."""
    seqlen = t.shape[1]
    nchunks = math.ceil(seqlen / chunk_size)
    pad = nchunks * chunk_size - seqlen
    if pad:
        t = F.pad(t, [0, 0] * (t.dim() - 2) + [0, pad], value=value)
    return t.reshape(t.shape[0], nchunks, chunk_size, *t.shape[2:])


def _unchunk(t: torch.Tensor, seqlen: int) -> torch.Tensor:
    """(b, c, Q, ...) -> (b, L, ...), dropping the padding."""
    return t.reshape(t.shape[0], t.shape[1] * t.shape[2], *t.shape[3:])[:, :seqlen]


def _heads(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """(b, L, g, n) -> (b, L, h, n): head i reads group i // (h // g)."""
    return t.repeat_interleave(nheads // t.shape[2], dim=2)


def _groups(t: torch.Tensor, ngroups: int, dim: int) -> torch.Tensor:
    """Sum a head axis into its groups (inverse of ``_heads``)."""
    shape = list(t.shape)
    shape[dim : dim + 1] = [ngroups, shape[dim] // ngroups]
    return t.reshape(shape).sum(dim + 1)


def _seq_info(seq_idx: torch.Tensor, chunk_size: int):
    """Per-chunk views of seq_idx.

    Returns (seq (b,c,Q) with padding -1, seq at each chunk's last valid position (b,c),
    seq at the position before each chunk (b,c), 0 for chunk 0 as in mamba-ssm).
    """
    seqlen = seq_idx.shape[1]
    nchunks = math.ceil(seqlen / chunk_size)
    seq = _chunk(seq_idx, chunk_size, value=-1)
    last_pos = (torch.arange(1, nchunks + 1, device=seq_idx.device) * chunk_size).clamp(max=seqlen) - 1
    last = seq_idx[:, last_pos]
    prev = torch.cat([torch.zeros_like(last[:, :1]), last[:, :-1]], dim=1)
    return seq, last, prev


def _bhcq(t: torch.Tensor) -> torch.Tensor:
    """(b, c, Q, h) -> (b, h, c, Q)."""
    return t.permute(0, 3, 1, 2)


def _bcqh(t: torch.Tensor) -> torch.Tensor:
    """(b, h, c, Q) -> (b, c, Q, h)."""
    return t.permute(0, 2, 3, 1)


def exp_nonpos(t: torch.Tensor) -> torch.Tensor:
    # The kernels compute exp(min(t, 0)): it never overflows, and equals exp(t) whenever A <= 0.
    return torch.exp(t.clamp(max=0.0))


def dt_transform(dt, dt_bias, dt_softplus, dt_limit):
    """dt + bias, softplus (identity above 20, as mamba-ssm), clamp to dt_limit."""
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt, threshold=20.0)
    return dt.clamp(dt_limit[0], dt_limit[1])


def _d_term(x: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """x * D for D of shape (h,) or (h, p); x is (..., h, p)."""
    return x * (D[:, None] if D.dim() == 1 else D)


def _d_grad(prod: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """Reduce dout * x (b, L, h, p) to D's shape."""
    dD = prod.sum(dim=(0, 1))
    return dD.sum(-1) if D.dim() == 1 else dD


# ----------------------------------------------------------------------------------------------------
# Forward stages
# ----------------------------------------------------------------------------------------------------


def chunk_cumsum_fwd(dt, A, chunk_size, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """``_chunk_cumsum_fwd``: dt (b,L,h), A (h) -> (dA_cumsum (b,h,c,Q), dt_out (b,h,c,Q)), both fp32.

    dt_out is dt after bias, softplus and clamp. Padded positions of the last chunk hold dt_out = 0, so
    dA_cumsum stays flat there at the value of the last real position.
    """
    batch, seqlen, nheads = dt.shape
    assert A.shape == (nheads,)
    cd = _cdtype(dt, A, dt_bias)
    d = dt_transform(dt.to(cd), None if dt_bias is None else dt_bias.to(cd), dt_softplus, dt_limit)
    d = _bhcq(_chunk(d, chunk_size))  # padding added after the transform: it must be 0, not f(0)
    dA_cumsum = torch.cumsum(d * A.to(cd)[:, None, None], dim=-1)
    od = _odtype(torch.float32, cd)
    return dA_cumsum.to(od), d.to(od)


def chunk_state_fwd(B, x, dt, dA_cumsum, seq_idx=None, states_in_fp32=True):
    """``_chunk_state_fwd``: the state each chunk would leave from a zero start.

    states[b,c,h,p,n] = sum_l exp(dA_cs[last] - dA_cs[l]) * dt[l] * x[l,p] * B[l,n]; with seq_idx only
    positions in the sequence of the chunk's last position count. Returns (b,c,h,p,n), fp32 (B.dtype
    if not states_in_fp32).
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    assert B.shape[:2] == (batch, seqlen) and nheads % B.shape[2] == 0
    assert dA_cumsum.shape == dt.shape == (batch, nheads, nchunks, chunk_size)
    cd = _cdtype(B, x, dt, dA_cumsum)
    Bc = _chunk(_heads(B.to(cd), nheads), chunk_size)
    xc = _chunk(x.to(cd), chunk_size)
    dA_cumsum = dA_cumsum.to(cd)
    scale = exp_nonpos(dA_cumsum[..., -1:] - dA_cumsum) * dt.to(cd)
    if seq_idx is not None:
        seq, last, _ = _seq_info(seq_idx, chunk_size)
        keep = (seq == last[..., None]) & (last[..., None] >= 0)
        scale = scale * keep[:, None].to(cd)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, scale, xc)
    return states.to(_odtype(torch.float32 if states_in_fp32 else B.dtype, cd))


def state_passing_fwd(states, dA_chunk_cumsum, initial_states=None, seq_idx=None, chunk_size=None,
                      out_dtype=None):
    """``_state_passing_fwd``: states (b,c,h,dim), dA_chunk_cumsum (b,h,c) = dA_cumsum[..., -1].

    Returns (out (b,c,h,dim): the state entering each chunk, out[:, 0] = initial_states or 0;
    final_states (b,h,dim) fp32). With seq_idx the carried state is dropped whenever a chunk's last
    position is in another sequence than the previous chunk's (sequence 0 before chunk 0).
    """
    batch, nchunks, nheads, dim = states.shape
    assert dA_chunk_cumsum.shape == (batch, nheads, nchunks)
    cd = _cdtype(states, dA_chunk_cumsum, initial_states)
    scale = torch.exp(dA_chunk_cumsum.to(cd))
    if seq_idx is not None:
        assert chunk_size is not None
        _, last, prev = _seq_info(seq_idx, chunk_size)
        scale = scale * (last == prev)[:, None].to(cd)
    carry = states.new_zeros((batch, nheads, dim), dtype=cd) if initial_states is None else initial_states.to(cd)
    outs = []
    for c in range(nchunks):  # sequential over chunks only
        outs.append(carry)
        carry = scale[:, :, c, None] * carry + states[:, c].to(cd)
    out = torch.stack(outs, dim=1)
    return (out.to(_odtype(states.dtype if out_dtype is None else out_dtype, cd)),
            carry.to(_odtype(torch.float32, cd)))


def chunk_state_passing_fwd(B, x, dt, dA_cumsum, initial_states=None, seq_idx=None, out_dtype=None):
    """``chunk_state_fwd`` then ``state_passing_fwd`` (``compose.chain_chunk_state_passing``): (the states
    entering each chunk (b,c,h,p,n) in out_dtype (default fp32), final_states (b,h,p,n) fp32)."""
    return compose.chain_chunk_state_passing(sys.modules[__name__], B, x, dt, dA_cumsum, initial_states, seq_idx,
                                             out_dtype)


def chunk_cumsum_state_passing_fwd(dt, A, B, x, chunk_size, dt_bias=None, dt_softplus=False,
                                   dt_limit=(0.0, float("inf")), initial_states=None, seq_idx=None, out_dtype=None):
    """``chunk_cumsum_fwd`` then ``chunk_state_passing_fwd`` (``compose.chain_chunk_cumsum_state_passing``):
    (dA_cumsum, dt_out (b,h,c,Q) fp32, the states entering each chunk (b,c,h,p,n) in out_dtype (default fp32),
    final_states (b,h,p,n) fp32)."""
    return compose.chain_chunk_cumsum_state_passing(sys.modules[__name__], dt, A, B, x, chunk_size, dt_bias=dt_bias,
                                                    dt_softplus=dt_softplus, dt_limit=dt_limit,
                                                    initial_states=initial_states, seq_idx=seq_idx,
                                                    out_dtype=out_dtype)


def _last_chunk_spans(cu_seqlens, chunk_size: int):
    """Per sequence [start, end) of ``cu_seqlens``, what its final state reads: (start, end, c, l0, first, last),
    with ``last`` its last position (0 for an empty sequence at the start), ``c`` the chunk holding it, ``l0``
    that chunk's first position and ``first`` the sequence's first position in it."""
    bounds = [int(v) for v in cu_seqlens.tolist()]
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        last = max(end - 1, 0)
        c = last // chunk_size
        yield start, end, c, c * chunk_size, max(start, c * chunk_size), last


def chunk_state_varlen(B, x, dt, dA_cumsum, cu_seqlens, chunk_states):
    """``chunk_state_varlen``: the final state of each sequence of a packed (batch 1) input.

    B (T,g,n), x (T,h,p), dt and dA_cumsum (h,c,Q), cu_seqlens (S+1), chunk_states (c,h,p,n): the states
    entering each chunk. For sequence [start, end) whose last position end-1 is in chunk c (l0 = c*Q):
    sum over l in [max(start, l0), end) of exp(dA_cs[end-1] - dA_cs[l]) * dt[l] * x[l,p] * B[l,n], plus
    chunk_states[c] * exp(dA_cs[end-1]) if start < l0 (dA_cs and dt of chunk c). An empty sequence gets 0.
    Returns (S,h,p,n) in chunk_states' dtype.
    """
    total_seqlen, nheads, headdim = x.shape
    _, nchunks, chunk_size = dt.shape
    assert B.shape[0] == total_seqlen and nheads % B.shape[1] == 0
    assert dA_cumsum.shape == dt.shape and chunk_states.shape == (nchunks, nheads, headdim, B.shape[2])
    cd = _cdtype(B, x, dt, dA_cumsum, chunk_states)
    Bh = _heads(B.to(cd)[None], nheads)[0]
    states = []
    for start, end, c, l0, first, last in _last_chunk_spans(cu_seqlens, chunk_size):
        dA = dA_cumsum[:, c].to(cd)  # (h, Q)
        scale = exp_nonpos(dA[:, last - l0, None] - dA[:, first - l0:end - l0]) * dt[:, c, first - l0:end - l0].to(cd)
        state = torch.einsum("hl,lhp,lhn->hpn", scale, x[first:end].to(cd), Bh[first:end])
        if start < l0:
            state = state + chunk_states[c].to(cd) * torch.exp(dA[:, last - l0])[:, None, None]
        states.append(state)
    out = torch.stack(states) if states else x.new_zeros((0, nheads, headdim, B.shape[2]), dtype=cd)
    return out.to(_odtype(chunk_states.dtype, cd))


def chunk_state_varlen_bwd(B, x, dt, dA_cumsum, cu_seqlens, chunk_states, dvarlen_states):
    """The gradient ``dvarlen_states`` (S,h,p,n) of ``chunk_state_varlen``'s output carried back to its inputs
    (mamba-ssm has no backward for it): (dB (T,g,n), dx (T,h,p), ddt (h,c,Q), ddA_cumsum (h,c,Q),
    dchunk_states (c,h,p,n)), in the compute dtype. ddA_cumsum is the gradient of dA_cumsum, not of dA.

    For sequence s with gradient G (h,p,n), positions l of its last chunk c and w_l = exp(dA_cs[end-1] - dA_cs[l]):
    dx[l] = w_l dt[l] sum_n G B[l], dB[l] = w_l dt[l] sum_p G x[l] (summed over each group's heads),
    ddt[l] = w_l r_l and ddA_cs[l] = -w_l dt[l] r_l with r_l = sum_pn G x[l] B[l], ddA_cs[end-1] gaining
    their sum; where the state entering chunk c counts (start < l0), dchunk_states[c] = G exp(dA_cs[end-1])
    and ddA_cs[end-1] gains sum_pn G chunk_states[c] exp(dA_cs[end-1]). The SSD's backward runs it for the
    Helion kernels too: a few small einsums per sequence, as the forward's reference is."""
    total_seqlen, nheads, _ = x.shape
    chunk_size = dt.shape[-1]
    cd = _cdtype(B, x, dt, dA_cumsum, chunk_states, dvarlen_states)
    Bh, xc, dtc, dAc = _heads(B.to(cd)[None], nheads)[0], x.to(cd), dt.to(cd), dA_cumsum.to(cd)
    dBh, dx = torch.zeros_like(Bh), torch.zeros_like(xc)
    ddt, ddA, dstates = torch.zeros_like(dtc), torch.zeros_like(dAc), torch.zeros_like(chunk_states, dtype=cd)
    for s, (start, end, c, l0, first, last) in enumerate(_last_chunk_spans(cu_seqlens, chunk_size)):
        grad = dvarlen_states[s].to(cd)  # (h, p, n)
        span = slice(first - l0, end - l0)
        weight = exp_nonpos(dAc[:, c, last - l0, None] - dAc[:, c, span])  # (h, l)
        scale = weight * dtc[:, c, span]
        gB = torch.einsum("hpn,lhn->lhp", grad, Bh[first:end])
        dx[first:end] += scale.T[..., None] * gB
        dBh[first:end] += scale.T[..., None] * torch.einsum("hpn,lhp->lhn", grad, xc[first:end])
        per_position = torch.einsum("lhp,lhp->hl", gB, xc[first:end])  # d state / d scale
        ddt[:, c, span] += weight * per_position
        ddA[:, c, span] -= scale * per_position
        ddA[:, c, last - l0] += (scale * per_position).sum(-1)
        if start < l0:
            decay = torch.exp(dAc[:, c, last - l0])  # (h,)
            dstates[c] += grad * decay[:, None, None]
            ddA[:, c, last - l0] += (grad * chunk_states[c].to(cd)).sum(dim=(1, 2)) * decay
    dB = dBh.view(total_seqlen, B.shape[1], nheads // B.shape[1], -1).sum(2)
    return dB, dx, ddt, ddA, dstates


def bmm_chunk_fwd(a, b, chunk_size, seq_idx=None, causal=False, output_dtype=None):
    """``_bmm_chunk_fwd``: per-chunk a @ b^T.

    a, b: (b,L,k) or (b,L,g,k) -> out (b,c,Q,Q) or (b,c,g,Q,Q), out[i,j] = a[i].b[j], zero at padded
    rows/columns and, with seq_idx, where seq_idx[i] != seq_idx[j]. With causal=True mamba-ssm leaves
    entries j > i undefined; here they are 0.
    """
    has_groups = a.dim() == 4
    assert b.shape == a.shape
    cd = _cdtype(a, b)
    ac = _chunk(a.to(cd) if has_groups else a.to(cd)[:, :, None], chunk_size)
    bc = _chunk(b.to(cd) if has_groups else b.to(cd)[:, :, None], chunk_size)
    out = torch.einsum("bcigk,bcjgk->bcgij", ac, bc)
    if seq_idx is not None:
        seq, _, _ = _seq_info(seq_idx, chunk_size)
        same = seq[:, :, None, :, None] == seq[:, :, None, None, :]
        out = out * same.to(cd)
    if causal:
        out = torch.tril(out)
    if not has_groups:
        out = out[:, :, 0]
    return out.to(_odtype(a.dtype if output_dtype is None else output_dtype, cd))


def chunk_scan_fwd(cb, x, dt, dA_cumsum, C, states, D=None, z=None, seq_idx=None):
    """``_chunk_scan_fwd``: the chunk outputs.

    y[l] = exp(dA_cs[l]) C[l].states[c]  (0 with seq_idx if l is not in the sequence of the position
    before the chunk) + sum_{s<=l} cb[l,s] exp(dA_cs[l]-dA_cs[s]) dt[s] x[s] + D x[l].
    cb must already be zero across sequences (``bmm_chunk_fwd`` with seq_idx does it).
    Returns (out = y * silu(z) or y, out_x = y or None), both (b,L,h,p) in x.dtype.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    ngroups = C.shape[2]
    assert cb.shape == (batch, nchunks, ngroups, chunk_size, chunk_size)
    assert states.shape == (batch, nchunks, nheads, headdim, C.shape[3])
    cd = _cdtype(cb, x, dt, dA_cumsum, C, states, D, z)
    dA_cumsum = dA_cumsum.to(cd)
    xc = _chunk(x.to(cd), chunk_size)
    # State entering the chunk, read out by C and decayed to each position.
    scale = torch.exp(dA_cumsum)
    if seq_idx is not None:
        seq, _, prev = _seq_info(seq_idx, chunk_size)
        scale = scale * (seq == prev[..., None])[:, None].to(cd)
    Cc = _chunk(_heads(C.to(cd), nheads), chunk_size)
    y = torch.einsum("bclhn,bchpn,bhcl->bclhp", Cc, states.to(cd), scale)
    # Intra-chunk causal part.
    seg = dA_cumsum[..., :, None] - dA_cumsum[..., None, :]  # (b,h,c,l,s)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    w = torch.where(causal, exp_nonpos(seg), 0.0) * dt.to(cd)[..., None, :]
    w = w * cb.to(cd).repeat_interleave(nheads // ngroups, dim=2).transpose(1, 2)
    y = y + torch.einsum("bhcls,bcshp->bclhp", w, xc)
    y = _unchunk(y, seqlen)
    if D is not None:
        y = y + _d_term(x.to(cd), D.to(cd))
    od = _odtype(x.dtype, cd)
    if z is None:
        return y.to(od), None
    return (y * F.silu(z.to(cd))).to(od), y.to(od)


def chunk_state_passing_scan_fwd(x, dt, dA_cumsum, B, C, D=None, z=None, initial_states=None, seq_idx=None,
                                 state_dtype=None):
    """``chunk_state_passing_fwd`` then ``bmm_chunk_scan_fwd`` (``compose.chain_chunk_state_passing_scan``):
    (out, out_x or None, final_states (b,h,p,n) fp32)."""
    return compose.chain_chunk_state_passing_scan(sys.modules[__name__], x, dt, dA_cumsum, B, C, D=D, z=z,
                                                  initial_states=initial_states, seq_idx=seq_idx,
                                                  state_dtype=state_dtype)


def ssd_fwd(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
            dt_softplus=False, dt_limit=(0.0, float("inf")), state_dtype=None):
    """The whole forward, ``chunk_cumsum_state_passing_fwd`` then ``bmm_chunk_scan_fwd``
    (``compose.chain_ssd_fwd``): (out, out_x or None, final_states (b,h,p,n) fp32)."""
    return compose.chain_ssd_fwd(sys.modules[__name__], x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                 initial_states=initial_states, seq_idx=seq_idx, dt_softplus=dt_softplus,
                                 dt_limit=dt_limit, state_dtype=state_dtype)


# ----------------------------------------------------------------------------------------------------
# Backward stages
# ----------------------------------------------------------------------------------------------------


def bmm_chunk_scan_fwd(x, dt, dA_cumsum, B, C, states, D=None, z=None, seq_idx=None):
    """``bmm_chunk_fwd`` then ``chunk_scan_fwd`` (``compose.chain_bmm_chunk_scan``): (out, out_x or None)."""
    return compose.chain_bmm_chunk_scan(sys.modules[__name__], x, dt, dA_cumsum, B, C, states, D=D, z=z,
                                        seq_idx=seq_idx)


def chunk_scan_bwd_dz(x, z, out, dout, chunk_size, has_ddAcs=True, D=None, dz=None, recompute_output=False):
    """``_chunk_scan_bwd_dz``: backward of the silu(z) gate; ``out`` is the pre-gate output (out_x).

    Returns (dz, dout_x, dD, ddA_cumsum) if has_ddAcs else (dz, dout_x, dD), plus outz if
    recompute_output. dout_x = dout * silu(z) is the gradient of out_x; dD (D's shape and dtype, None
    without D) = sum dout_x * x; ddA_cumsum (b,h,c,Q) fp32 = sum_p dout_x * (out - D x), 0 at padding.
    """
    batch, seqlen, nheads, headdim = x.shape
    assert z.shape == out.shape == dout.shape == x.shape
    cd = _cdtype(x, z, out, dout, D)
    xf, zf, outf, doutf = (t.to(cd) for t in (x, z, out, dout))
    sig = torch.sigmoid(zf)
    dz_ = doutf * outf * sig * (1 + zf * (1 - sig))
    dout_x = doutf * zf * sig
    dD = None
    if D is not None:
        dD = _d_grad(dout_x * xf, D).to(_odtype(D.dtype, cd))
        outf = outf - _d_term(xf, D.to(cd))
    vals = (dz_.to(_odtype(z.dtype, cd)), dout_x.to(_odtype(dout.dtype, cd)), dD)
    if has_ddAcs:
        ddA = _bhcq(_chunk((dout_x * outf).sum(-1), chunk_size))
        vals = (*vals, ddA.to(_odtype(torch.float32, cd)))
    if recompute_output:
        vals = (*vals, (out.to(cd) * zf * sig).to(_odtype(x.dtype, cd)))  # gated, D included
    return vals


def chunk_scan_bwd_dstates(C, dA_cumsum, dout, seq_idx=None, dtype=None):
    """``_chunk_scan_bwd_dstates``: gradient of the states entering each chunk, from the outputs.

    dstates[b,c,h,p,n] = sum_l exp(dA_cs[l]) dout[l,p] C[l,n] (same seq_idx mask as chunk_scan_fwd).
    Returns (b,c,h,p,n) in ``dtype`` (default C.dtype).
    """
    batch, seqlen, nheads, headdim = dout.shape
    _, _, nchunks, chunk_size = dA_cumsum.shape
    cd = _cdtype(C, dA_cumsum, dout)
    scale = torch.exp(dA_cumsum.to(cd))
    if seq_idx is not None:
        seq, _, prev = _seq_info(seq_idx, chunk_size)
        scale = scale * (seq == prev[..., None])[:, None].to(cd)
    Cc = _chunk(_heads(C.to(cd), nheads), chunk_size)
    doutc = _chunk(dout.to(cd), chunk_size)
    dstates = torch.einsum("bclhp,bhcl,bclhn->bchpn", doutc, scale, Cc)
    return dstates.to(_odtype(C.dtype if dtype is None else dtype, cd))


def state_passing_bwd(states, dA_chunk_cumsum, dout, dfinal_states=None, seq_idx=None,
                      has_initial_states=None, dstates_dtype=None, states_dtype=None, chunk_size=None):
    """``_state_passing_bwd``: states (b,c,h,dim) is the *output* of state_passing_fwd (index 0 holds
    the initial states); dout (b,c,h,dim) the gradient of that output.

    Returns (dstates, ddA_chunk_cumsum (b,h,c), dinitial_states or None), plus the states converted
    when states_dtype is given. dstates[:, c] is the gradient of the fwd input states[:, c] (the last
    one is dfinal_states, or 0). ddA_chunk_cumsum[:, :, 0] is 0 without initial states.
    """
    batch, nchunks, nheads, dim = states.shape
    assert dA_chunk_cumsum.shape == (batch, nheads, nchunks)
    assert dout.shape == states.shape
    cd = _cdtype(states, dA_chunk_cumsum, dout, dfinal_states)
    scale = torch.exp(dA_chunk_cumsum.to(cd))
    if seq_idx is not None:
        assert chunk_size is not None
        _, last, prev = _seq_info(seq_idx, chunk_size)
        scale = scale * (last == prev)[:, None].to(cd)
    grad = states.new_zeros((batch, nheads, dim), dtype=cd) if dfinal_states is None else dfinal_states.to(cd)
    dstates = [None] * nchunks
    ddA = [None] * nchunks
    for c in reversed(range(nchunks)):  # sequential over chunks only
        dstates[c] = grad
        ddA[c] = (states[:, c].to(cd) * grad).sum(-1) * scale[:, :, c]
        grad = scale[:, :, c, None] * grad + dout[:, c].to(cd)
    if not has_initial_states:
        ddA[0] = torch.zeros_like(ddA[0])
    dst_dtype = _odtype(dout.dtype if dstates_dtype is None else dstates_dtype, cd)
    vals = (torch.stack(dstates, dim=1).to(dst_dtype),
            torch.stack(ddA, dim=-1).to(_odtype(dA_chunk_cumsum.dtype, cd)),
            grad.to(dst_dtype) if has_initial_states else None)
    if states_dtype is None:
        return vals
    # mamba-ssm converts to dstates_dtype (or dout.dtype), not to states_dtype, when they differ.
    conv = states.dtype if states_dtype == states.dtype else dst_dtype
    return (*vals, states.to(_odtype(conv, cd)))


def chunk_state_passing_bwd(C, dA_cumsum, dout, states, dfinal_states=None, seq_idx=None, has_initial_states=False,
                            dstates_dtype=None, states_dtype=None, dstates_in=None):
    """``chunk_scan_bwd_dstates`` then ``state_passing_bwd`` (``compose.chain_chunk_state_passing_bwd``);
    states (b,c,h,p,n) entering each chunk; ``dstates_in``, a gradient of those states from elsewhere. Returns
    (dstates (b,c,h,p,n), ddA_chunk_cumsum (b,h,c), dinitial_states or None[, the states converted, when
    states_dtype is given])."""
    return compose.chain_chunk_state_passing_bwd(sys.modules[__name__], C, dA_cumsum, dout, states, dfinal_states,
                                                 seq_idx, has_initial_states, dstates_dtype, states_dtype, dstates_in)


def chunk_scan_chunk_state_bwd_dx(x, dt, dA_cumsum, B, CB, dout, dstates, D=None, seq_idx=None, dx=None):
    """``_chunk_scan_chunk_state_bwd_dx`` (ssd_combined.py): gradient of x through chunk_state and
    chunk_scan.

    acc[l,p] = exp(dA_cs[last]-dA_cs[l]) B[l].dstates[c][p] (seq_idx: l in the last position's
    sequence) + sum_{s>=l} CB[s,l] exp(dA_cs[s]-dA_cs[l]) dout[s,p].
    Returns (dx = acc*dt + D*dout (x.dtype), ddt (b,h,c,Q) fp32 = sum_p acc*x, dD or None).
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    ngroups = B.shape[2]
    assert CB.shape == (batch, nchunks, ngroups, chunk_size, chunk_size)
    assert dstates.shape == (batch, nchunks, nheads, headdim, B.shape[3])
    cd = _cdtype(x, dt, dA_cumsum, B, CB, dout, dstates, D)
    dA_cumsum = dA_cumsum.to(cd)
    scale = exp_nonpos(dA_cumsum[..., -1:] - dA_cumsum)
    if seq_idx is not None:
        seq, last, _ = _seq_info(seq_idx, chunk_size)
        scale = scale * (seq == last[..., None])[:, None].to(cd)
    Bc = _chunk(_heads(B.to(cd), nheads), chunk_size)
    acc = torch.einsum("bclhn,bchpn,bhcl->bclhp", Bc, dstates.to(cd), scale)
    seg = dA_cumsum[..., :, None] - dA_cumsum[..., None, :]  # (b,h,c,s,l) = dA_cs[s] - dA_cs[l]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    w = torch.where(causal, exp_nonpos(seg), 0.0)
    w = w * CB.to(cd).repeat_interleave(nheads // ngroups, dim=2).transpose(1, 2)
    doutc = _chunk(dout.to(cd), chunk_size)
    acc = acc + torch.einsum("bhcsl,bcshp->bclhp", w, doutc)
    xc = _chunk(x.to(cd), chunk_size)
    ddt = _bhcq((acc * xc).sum(-1))
    dxc = acc * _bcqh(dt.to(cd))[..., None]
    dx_ = _unchunk(dxc, seqlen)
    dD = None
    if D is not None:
        dx_ = dx_ + _d_term(dout.to(cd), D.to(cd))
        dD = _d_grad(dout.to(cd) * x.to(cd), D).to(_odtype(D.dtype, cd))
    return dx_.to(_odtype(x.dtype, cd)), ddt.to(_odtype(torch.float32, cd)), dD


def chunk_state_bwd_db(x, dt, dA_cumsum, dstates, seq_idx=None, B=None, ngroups=1):
    """``_chunk_state_bwd_db``: gradient of B through chunk_state (fp32, (b,L,g,n)).

    With B given also returns ddA (b,h,c,Q) fp32: the gradient of dA (per position, *not* of its
    cumsum) through chunk_state, ddA[l] = sum_{s<l} t[s], t[s] = sum_n dB_head[s,n] B[s,n].
    Returns dB, or (dB, ddA) when B is given.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    cd = _cdtype(x, dt, dA_cumsum, dstates, B)
    dA_cumsum = dA_cumsum.to(cd)
    scale = exp_nonpos(dA_cumsum[..., -1:] - dA_cumsum) * dt.to(cd)
    if seq_idx is not None:
        seq, last, _ = _seq_info(seq_idx, chunk_size)
        scale = scale * (seq == last[..., None])[:, None].to(cd)
    xc = _chunk(x.to(cd), chunk_size)
    db = torch.einsum("bclhp,bchpn,bhcl->bclhn", xc, dstates.to(cd), scale)  # per head
    dB = _unchunk(_groups(db, ngroups, dim=3), seqlen).to(_odtype(torch.float32, cd))
    if B is None:
        return dB
    t = _bhcq((db * _chunk(_heads(B.to(cd), nheads), chunk_size)).sum(-1))
    ddA = F.pad(torch.cumsum(t, dim=-1)[..., :-1], (1, 0))  # exclusive cumsum
    return dB, ddA.to(_odtype(torch.float32, cd))


def chunk_scan_bwd_dC(prev_states, dA_cumsum, dout, seq_idx=None, C=None, ngroups=1):
    """``_chunk_scan_bwd_dC``: gradient of C through the state term of chunk_scan (fp32, (b,L,g,n)).

    With C given also returns ddA_cumsum_prev (b,h,c,Q) fp32 = sum_n dC_head * C: the gradient of
    dA_cumsum (not yet reverse-cumsummed) through that term. Returns dC or (dC, ddA_cumsum_prev).
    """
    batch, nchunks, nheads, headdim, dstate = prev_states.shape
    _, seqlen, _, _ = dout.shape
    chunk_size = dA_cumsum.shape[-1]
    cd = _cdtype(prev_states, dA_cumsum, dout, C)
    scale = torch.exp(dA_cumsum.to(cd))
    if seq_idx is not None:
        seq, _, prev = _seq_info(seq_idx, chunk_size)
        scale = scale * (seq == prev[..., None])[:, None].to(cd)
    doutc = _chunk(dout.to(cd), chunk_size)
    dc = torch.einsum("bclhp,bchpn,bhcl->bclhn", doutc, prev_states.to(cd), scale)  # per head
    dC = _unchunk(_groups(dc, ngroups, dim=3), seqlen).to(_odtype(torch.float32, cd))
    if C is None:
        return dC
    ddA = _bhcq((dc * _chunk(_heads(C.to(cd), nheads), chunk_size)).sum(-1))
    return dC, ddA.to(_odtype(torch.float32, cd))


def _intra_ddA(m: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Gradient of dA[j] from M[l,s] (b,h,c,l,s), the gradient of the intra-chunk decay
    exp(dA_cs[l]-dA_cs[s]) times that decay: ddA[j] = sum_{l>=j>s} M[l,s]."""
    strict = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=m.device).tril(-1)
    m = torch.where(strict, m, 0.0)
    # prefix[l, j-1] = sum_{s<j} M[l,s]; keep l >= j, sum over l.
    prefix = torch.where(strict, torch.cumsum(m, dim=-1), 0.0)
    return F.pad(prefix.sum(-2)[..., :-1], (1, 0))


def chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, seq_idx=None, CB=None, ngroups=1):
    """``_chunk_scan_bwd_dcb``: gradient of CB (b,c,g,Q,Q) fp32, lower triangle (l >= s) only.

    dCB[l,s] = sum_{heads of g} dout[l].x[s] dt[s] exp(dA_cs[l]-dA_cs[s]), 0 across sequences.
    With CB given also returns the intra-chunk ddA (as chunk_scan_bwd_ddAcs_stable; mamba-ssm does not
    use this path and does not support it with seq_idx). Returns dCB or (dCB, ddA).
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    cd = _cdtype(x, dt, dA_cumsum, dout, CB)
    dA_cumsum = dA_cumsum.to(cd)
    xc = _chunk(x.to(cd), chunk_size)
    doutc = _chunk(dout.to(cd), chunk_size)
    seg = dA_cumsum[..., :, None] - dA_cumsum[..., None, :]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    w = torch.where(causal, exp_nonpos(seg), 0.0) * dt.to(cd)[..., None, :]
    dcb_h = torch.einsum("bclhp,bcshp->bhcls", doutc, xc) * w
    if seq_idx is not None:
        seq, _, _ = _seq_info(seq_idx, chunk_size)
        dcb_h = dcb_h * (seq[..., :, None] == seq[..., None, :])[:, None].to(cd)
    dcb = _groups(dcb_h, ngroups, dim=1).transpose(1, 2).to(_odtype(torch.float32, cd))
    if CB is None:
        return dcb
    cb_h = CB.to(cd).repeat_interleave(nheads // ngroups, dim=2).transpose(1, 2)
    return dcb, _intra_ddA(dcb_h * cb_h, chunk_size).to(_odtype(torch.float32, cd))


def bmm_chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, B, C, seq_idx=None, ngroups=1):
    """``bmm_chunk_fwd`` then ``chunk_scan_bwd_dcb`` with its CB (``compose.chain_bmm_chunk_scan_bwd_dcb``):
    (CB (b,c,g,Q,Q), dCB, ddA (b,h,c,Q))."""
    return compose.chain_bmm_chunk_scan_bwd_dcb(sys.modules[__name__], x, dt, dA_cumsum, dout, B, C, seq_idx=seq_idx,
                                                ngroups=ngroups)


def bmm_chunk_bwd(a, dout, residual=None, out=None):
    """``_bmm_chunk_bwd``: gradient of ``b`` in out = bmm_chunk_fwd(a, b).

    a: (b,L,k) or (b,L,g,k); dout: (b,c,Q,Q) or (b,c,g,Q,Q). Returns
    db[s] = sum_i dout[i,s] a[i] (+ residual), shape and dtype of ``a``.
    """
    has_groups = a.dim() == 4
    seqlen = a.shape[1]
    cd = _cdtype(a, dout, residual)
    ac = _chunk(a.to(cd) if has_groups else a.to(cd)[:, :, None], dout.shape[-1])
    doutg = dout.to(cd) if has_groups else dout.to(cd)[:, :, None]
    db = _unchunk(torch.einsum("bcgis,bcigk->bcsgk", doutg, ac), seqlen)
    if not has_groups:
        db = db[:, :, 0]
    if residual is not None:
        db = db + residual.to(cd)
    return db.to(_odtype(a.dtype if out is None else out.dtype, cd))


def chunk_bwd_db_dc(x, dt, dA_cumsum, B, C, dout, states, dstates, dcb, seq_idx=None, dB=None, dC=None):
    """``chunk_state_bwd_db``, ``chunk_scan_bwd_dC``, then ``bmm_chunk_bwd`` twice (``compose.chain_chunk_bwd_db_dc``):
    (dB, dC, ddA_next, ddA_prev). The buffers dB and dC are ignored, as ``bmm_chunk_bwd`` ignores ``out``."""
    return compose.chain_chunk_bwd_db_dc(sys.modules[__name__], x, dt, dA_cumsum, B, C, dout, states, dstates, dcb,
                                         seq_idx=seq_idx, dB=dB, dC=dC)


def chunk_scan_bwd_ddAcs_stable(x, dt, dA_cumsum, dout, cb):
    """``_chunk_scan_bwd_ddAcs_stable``: gradient of dA (per position) through the intra-chunk decay of
    chunk_scan: ddA[j] = sum_{l>=j>s} dout[l].x[s] dt[s] cb[l,s] exp(dA_cs[l]-dA_cs[s]).
    Returns (b,h,c,Q) fp32, ddA[..., 0] = 0. No seq_idx: cb is already zero across sequences.
    """
    batch, seqlen, nheads, headdim = x.shape
    _, _, nchunks, chunk_size = dt.shape
    ngroups = cb.shape[2]
    cd = _cdtype(x, dt, dA_cumsum, dout, cb)
    dA_cumsum = dA_cumsum.to(cd)
    xc = _chunk(x.to(cd), chunk_size)
    doutc = _chunk(dout.to(cd), chunk_size)
    seg = dA_cumsum[..., :, None] - dA_cumsum[..., None, :]
    strict = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril(-1)
    w = torch.where(strict, exp_nonpos(seg), 0.0) * dt.to(cd)[..., None, :]
    w = w * cb.to(cd).repeat_interleave(nheads // ngroups, dim=2).transpose(1, 2)
    m = torch.einsum("bclhp,bcshp->bhcls", doutc, xc) * w
    return _intra_ddA(m, chunk_size).to(_odtype(torch.float32, cd))


def chunk_cumsum_bwd(ddA, ddt_out, dt, A, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                     ddt=None):
    """``_chunk_cumsum_bwd``: ddA (b,h,c,Q) is the gradient of dA = dt_out * A (per position, not of
    its cumsum); ddt_out (b,h,c,Q) the gradient of dt_out.

    Returns (ddt (b,L,h) dt.dtype, dA (h) fp32, ddt_bias (h) fp32 or None). ddt is 0 where dt was
    clamped by dt_limit (strictly outside it).
    """
    batch, seqlen, nheads = dt.shape
    cd = _cdtype(ddA, ddt_out, dt, A, dt_bias)
    ddA_l = _unchunk(_bcqh(ddA.to(cd)), seqlen)
    g = ddA_l * A.to(cd) + _unchunk(_bcqh(ddt_out.to(cd)), seqlen)
    pre = dt.to(cd) if dt_bias is None else dt.to(cd) + dt_bias.to(cd)
    soft = F.softplus(pre, threshold=20.0) if dt_softplus else pre
    g = torch.where((soft < dt_limit[0]) | (soft > dt_limit[1]), 0.0, g)
    if dt_softplus:
        g = torch.where(pre <= 20.0, g * torch.sigmoid(pre), g)
    dA = (ddA_l * soft.clamp(dt_limit[0], dt_limit[1])).sum(dim=(0, 1))
    f32 = _odtype(torch.float32, cd)
    ddt_bias = g.sum(dim=(0, 1)).to(f32) if dt_bias is not None else None
    return g.to(_odtype(dt.dtype, cd)), dA.to(f32), ddt_bias


def combine_ddA_terms(ddA_intra, ddA_next, ddA_cumsum_prev, ddA_chunk_cumsum):
    """The gradient of dA per position (b,h,c,Q) from the backward's three terms, as mamba-ssm's combined
    backward adds them: the state terms (ddA_cumsum_prev, plus ddA_chunk_cumsum (b,h,c) at each chunk's
    last position) are gradients of dA_cumsum, so a reverse cumsum turns them into that of dA."""
    prev = ddA_cumsum_prev.clone()
    prev[..., -1] += ddA_chunk_cumsum
    return ddA_intra + ddA_next + prev.flip([-1]).cumsum(dim=-1).flip([-1])


def chunk_cumsum_bwd_of_terms(ddA_intra, ddA_next, ddA_cumsum_prev, ddA_chunk_cumsum, ddt_out, dt, A, dt_bias=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf")), ddt=None):
    """The backward's last stage, from the ddA terms as the stages return them: ``chunk_cumsum_bwd`` of
    ``combine_ddA_terms``."""
    ddA = combine_ddA_terms(ddA_intra, ddA_next, ddA_cumsum_prev, ddA_chunk_cumsum)
    return chunk_cumsum_bwd(ddA, ddt_out, dt, A, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)


def finish_ddA_terms(intra_steps, next_steps, prev_parts):
    """The terms from the partials that the Helion dCB, dB and dC stages give ``unfinished`` (b,h,c,Q,k):
    ddA_intra and ddA_next are exclusive prefix sums of their steps, ddA_cumsum_prev a plain sum."""
    return exclusive_cumsum(intra_steps.sum(-1)), exclusive_cumsum(next_steps.sum(-1)), prev_parts.sum(-1)


def chunk_cumsum_bwd_of_partial_terms(intra_steps, next_steps, prev_parts, chunk_grad, ddt_out, dt, A, dt_bias=None,
                                      dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """Reference of ``mamba2_kernels.ssd.chunk_cumsum_bwd.chunk_cumsum_bwd_of_terms`` (same arguments)."""
    return chunk_cumsum_bwd_of_terms(*finish_ddA_terms(intra_steps, next_steps, prev_parts), chunk_grad, ddt_out,
                                     dt, A, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)


# ----------------------------------------------------------------------------------------------------
# Whole call
# ----------------------------------------------------------------------------------------------------


def ssd_chunked_ref(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                    seq_idx=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                    cu_seqlens=None, return_varlen_states=False, state_dtype=None):
    """``mamba_chunk_scan_combined`` forward composed from the stage references (differentiable).

    x (b,L,h,p), dt (b,L,h), A (h), B/C (b,L,g,n), D (h) or (h,p), z like x, dt_bias (h),
    initial_states (b,h,p,n), seq_idx (b,L), cu_seqlens (num_seqs+1) with batch 1, used only with
    return_varlen_states. Returns out, then final_states (b,h,p,n) if return_final_states, then
    varlen_states (num_seqs,h,p,n) if return_varlen_states.
    """
    out, _, final_states, *varlen = compose.forward(
        sys.modules[__name__], x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
        seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=dt_limit,
        cu_seqlens=cu_seqlens if return_varlen_states else None, state_dtype=state_dtype)
    results = (out, *((final_states,) if return_final_states else ()), *varlen)
    return results if len(results) > 1 else out


def ssd_chunked_bwd_ref(dout, x, dt, A, B, C, out, chunk_size, D=None, z=None, dt_bias=None,
                        initial_states=None, dfinal_states=None, seq_idx=None, dt_softplus=False,
                        dt_limit=(0.0, float("inf")), state_dtype=None):
    """``_mamba_chunk_scan_combined_bwd`` composed from the backward references, in the same order.

    ``out`` is the forward's pre-gate output out_x when z is given, else out. Returns
    (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states).
    """
    return compose.backward(sys.modules[__name__], dout, x, dt, A, B, C, out, chunk_size, D=D, z=z, dt_bias=dt_bias,
                            initial_states=initial_states, dfinal_states=dfinal_states, seq_idx=seq_idx,
                            dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=state_dtype)


def ssd_recurrent_ref(x, dt, A, B, C, chunk_size=None, D=None, z=None, dt_bias=None, initial_states=None,
                      seq_idx=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                      return_final_states=False):
    """Per-time-step recurrence, independent of the chunked code (chunk_size is ignored).

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = C_t h_t + D x_t, out = y * silu(z).
    With seq_idx the state restarts from 0 where seq_idx changes; initial_states belong to sequence 0
    (they are dropped if seq_idx[:, 0] != 0), as in mamba-ssm.
    """
    batch, seqlen, nheads, headdim = x.shape
    cd = _cdtype(x, dt, A, B, C, D, z, dt_bias, initial_states)
    d = dt_transform(dt.to(cd), None if dt_bias is None else dt_bias.to(cd), dt_softplus, dt_limit)
    xf = x.to(cd)
    Bh = _heads(B.to(cd), nheads)
    Ch = _heads(C.to(cd), nheads)
    decay = torch.exp(d * A.to(cd))  # (b,L,h)
    state = (x.new_zeros((batch, nheads, headdim, B.shape[-1]), dtype=cd) if initial_states is None
             else initial_states.to(cd))
    ys = []
    for t in range(seqlen):
        if seq_idx is not None:
            before = seq_idx[:, t - 1] if t > 0 else torch.zeros_like(seq_idx[:, 0])
            state = state * (seq_idx[:, t] == before).to(cd)[:, None, None, None]
        inp = (d[:, t, :, None] * xf[:, t])[..., None] * Bh[:, t, :, None, :]
        state = decay[:, t, :, None, None] * state + inp
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]))
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + _d_term(xf, D.to(cd))
    if z is not None:
        y = y * F.silu(z.to(cd))
    y = y.to(_odtype(x.dtype, cd))
    return (y, state.to(_odtype(torch.float32, cd))) if return_final_states else y
