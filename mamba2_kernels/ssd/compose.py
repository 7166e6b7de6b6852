"""The SSD forward and backward as mamba-ssm's ``_mamba_chunk_scan_combined_fwd`` / ``_bwd`` compose them,
written once over a set of stage functions: ``mamba2_kernels.ssd.naive`` (the pure-PyTorch references) and the
Helion kernels both run through it, so the two can only differ in their stages. Pure PyTorch glue; it
imports no kernel implementation itself. Changes from mamba-ssm's order, each a fused stage that
spares a round trip through memory (``chain_*`` below are their unfused forms, the references):
  * chunk_state_passing_fwd: the chunk states and their passing in one pass (mamba-ssm: chunk_state_fwd then
    state_passing_fwd), in the forward and in the backward's recompute;
  * chunk_cumsum_state_passing_fwd: chunk_cumsum in that pass as well (mamba-ssm: chunk_cumsum_fwd before
    them), so that the forward is two launches;
  * chunk_state_passing_bwd: the states' gradient from the outputs and its passing back in one pass
    (mamba-ssm: chunk_scan_bwd_dstates then state_passing_bwd);
  * bmm_chunk_scan_fwd: the forward's outputs, with each chunk's C B^T made where it is used (mamba-ssm:
    bmm_chunk_fwd then chunk_scan_fwd, which stores it and reads it back);
  * ssd_fwd: the whole forward, where a GPU's rule says so as chunk_cumsum and then one launch for the rest
    (``chunk_state_passing_scan_fwd``), which writes no per-chunk states (``chain_ssd_fwd``: the two stages
    above);
  * bmm_chunk_scan_bwd_dcb: the backward's C B^T made by the dCB stage, which stores it for the dx stage
    (mamba-ssm: bmm_chunk_fwd, whose result the dCB stage reads back);
  * chunk_bwd_db_dc: the gradients of B and C, their state terms and their intra-chunk (dCB) terms, in one
    pass (mamba-ssm: chunk_state_bwd_db, chunk_scan_bwd_dC, then bmm_chunk_bwd twice on their fp32 results);
  * the intra-chunk ddA comes from the dCB stage (its ``CB=`` form), which has the same products in hand,
    not from a separate pass (``chunk_scan_bwd_ddAcs_stable``) that recomputes them;
  * the three ddA terms are combined by the last stage, ``chunk_cumsum_bwd_of_terms``, in whatever form the
    dB, dC and dCB stages return them (finished in naive; partials that its kernel sums, for Helion).

``stages`` is any object with the stage functions as attributes, named as in ``mamba2_kernels.ssd.naive``:
ssd_fwd, chunk_cumsum_state_passing_fwd, bmm_chunk_scan_fwd, chunk_scan_bwd_dz, chunk_state_passing_bwd,
bmm_chunk_scan_bwd_dcb, chunk_scan_chunk_state_bwd_dx, chunk_bwd_db_dc,
chunk_cumsum_bwd_of_terms; and chunk_state_varlen, which the forward
calls only when given cu_seqlens, and chunk_state_varlen_bwd, which the backward calls only when given a
gradient of the varlen states.
"""

from __future__ import annotations

from typing import Any

import torch

from mamba2_kernels._buffers import check_out, empty_dense

INF = float("inf")


def _flat(t: torch.Tensor | None) -> torch.Tensor | None:
    """(..., p, n) -> (..., p*n): the layout the state-passing stages take."""
    return None if t is None else t.reshape(*t.shape[:-2], -1)


def _unflat(t: torch.Tensor | None, dstate: int) -> torch.Tensor | None:
    return None if t is None else t.reshape(*t.shape[:-1], -1, dstate)


def chain_chunk_state_passing(stages: Any, B, x, dt, dA_cumsum, initial_states=None, seq_idx=None, out_dtype=None):
    """``chunk_state_passing_fwd`` as mamba-ssm computes it: ``stages.chunk_state_fwd`` (fp32 states) then
    ``stages.state_passing_fwd`` on them flattened. Returns (the states entering each chunk (b, c, h, p, n) in
    out_dtype (default fp32), final_states (b, h, p, n) fp32)."""
    dstate = B.shape[-1]
    states = stages.chunk_state_fwd(B, x, dt, dA_cumsum, seq_idx=seq_idx, states_in_fp32=True)
    states, final_states = stages.state_passing_fwd(
        _flat(states), dA_cumsum[:, :, :, -1], initial_states=_flat(initial_states), seq_idx=seq_idx,
        chunk_size=dt.shape[-1], out_dtype=out_dtype)
    return _unflat(states, dstate), _unflat(final_states, dstate)


def chain_chunk_cumsum_state_passing(stages: Any, dt, A, B, x, chunk_size, dt_bias=None, dt_softplus=False,
                                     dt_limit=(0.0, INF), initial_states=None, seq_idx=None, out_dtype=None):
    """``chunk_cumsum_state_passing_fwd`` as mamba-ssm computes it: ``stages.chunk_cumsum_fwd``, then
    ``stages.chunk_state_passing_fwd`` on its results. Returns (dA_cumsum, dt_out (b, h, c, Q) fp32, the states
    entering each chunk (b, c, h, p, n) in out_dtype (default fp32), final_states (b, h, p, n) fp32)."""
    dA_cumsum, dt_out = stages.chunk_cumsum_fwd(dt, A, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                                dt_limit=dt_limit)
    states, final_states = stages.chunk_state_passing_fwd(B, x, dt_out, dA_cumsum, initial_states=initial_states,
                                                          seq_idx=seq_idx, out_dtype=out_dtype)
    return dA_cumsum, dt_out, states, final_states


def chain_chunk_state_passing_bwd(stages: Any, C, dA_cumsum, dout, states, dfinal_states=None, seq_idx=None,
                                  has_initial_states=False, dstates_dtype=None, states_dtype=None, dstates_in=None):
    """``chunk_state_passing_bwd`` as mamba-ssm computes it: ``stages.chunk_scan_bwd_dstates`` (in the states'
    dtype) then ``stages.state_passing_bwd`` on the flattened states. ``dstates_in`` (b, c, h, p, n): a gradient
    of the states entering each chunk that does not come from the outputs (the varlen states'), added to
    theirs. Returns (dstates (b, c, h, p, n), ddA_chunk_cumsum (b, h, c), dinitial_states or None[, the states
    converted, when states_dtype is given])."""
    dstate = C.shape[-1]
    dstates = stages.chunk_scan_bwd_dstates(C, dA_cumsum, dout, seq_idx=seq_idx, dtype=states.dtype)
    if dstates_in is not None:
        wide = torch.promote_types(dstates.dtype, torch.float32)
        dstates = (dstates.to(wide) + dstates_in.to(wide)).to(dstates.dtype)
    results = stages.state_passing_bwd(
        _flat(states), dA_cumsum[:, :, :, -1], _flat(dstates), dfinal_states=_flat(dfinal_states), seq_idx=seq_idx,
        has_initial_states=has_initial_states, dstates_dtype=dstates_dtype, states_dtype=states_dtype,
        chunk_size=dA_cumsum.shape[-1])
    dstates, ddA_chunk_cumsum, dinitial_states, *converted = results
    return (_unflat(dstates, dstate), ddA_chunk_cumsum, _unflat(dinitial_states, dstate),
            *(_unflat(t, dstate) for t in converted))


def chain_bmm_chunk_scan(stages: Any, x, dt, dA_cumsum, B, C, states, D=None, z=None, seq_idx=None):
    """``bmm_chunk_scan_fwd`` as mamba-ssm computes it: ``stages.bmm_chunk_fwd`` (C B^T per chunk, fp32, zero
    across sequences) then ``stages.chunk_scan_fwd`` on it. Returns (out, out_x or None)."""
    cb = stages.bmm_chunk_fwd(C, B, dt.shape[-1], seq_idx=seq_idx, output_dtype=torch.float32)
    return stages.chunk_scan_fwd(cb, x, dt, dA_cumsum, C, states, D=D, z=z, seq_idx=seq_idx)


def chain_bmm_chunk_scan_bwd_dcb(stages: Any, x, dt, dA_cumsum, dout, B, C, seq_idx=None, ngroups=1):
    """``bmm_chunk_scan_bwd_dcb`` as mamba-ssm computes it: ``stages.bmm_chunk_fwd`` (C B^T per chunk, fp32, zero
    across sequences), then ``stages.chunk_scan_bwd_dcb`` with it. Returns (CB, dCB, the intra-chunk ddA in
    whatever form that stage returns it)."""
    cb = stages.bmm_chunk_fwd(C, B, dt.shape[-1], seq_idx=seq_idx, output_dtype=torch.float32)
    return (cb, *stages.chunk_scan_bwd_dcb(x, dt, dA_cumsum, dout, seq_idx=seq_idx, CB=cb, ngroups=ngroups))


def chain_chunk_bwd_db_dc(stages: Any, x, dt, dA_cumsum, B, C, dout, states, dstates, dcb, seq_idx=None, dB=None,
                          dC=None):
    """``chunk_bwd_db_dc`` as mamba-ssm computes it: ``stages.chunk_state_bwd_db`` and ``stages.chunk_scan_bwd_dC``
    (the state terms, fp32, with ddA_next and ddA_prev), then ``stages.bmm_chunk_bwd`` twice, adding the
    intra-chunk terms of ``dcb`` and storing in B's and C's dtype (or into the given buffers). Returns (dB, dC,
    ddA_next, ddA_prev), the ddA terms in whatever form the two stages return them."""
    ngroups = B.shape[2]
    dB_state, ddA_next = stages.chunk_state_bwd_db(x, dt, dA_cumsum, dstates, seq_idx=seq_idx, B=B, ngroups=ngroups)
    dC_state, ddA_prev = stages.chunk_scan_bwd_dC(states, dA_cumsum, dout, seq_idx=seq_idx, C=C, ngroups=ngroups)
    dB = stages.bmm_chunk_bwd(C, dcb, residual=dB_state, out=empty_dense(B) if dB is None else dB)
    dC = stages.bmm_chunk_bwd(B, dcb.transpose(-1, -2), residual=dC_state,
                              out=empty_dense(C) if dC is None else dC)
    return dB, dC, ddA_next, ddA_prev


def _chained_forward(stages: Any, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                     seq_idx=None, dt_softplus=False, dt_limit=(0.0, INF), state_dtype=None):
    """The forward's two stages: (out, out_x or None, dt_out, dA_cumsum, the states entering each chunk (in
    ``state_dtype``, default C's dtype), final_states fp32)."""
    dA_cumsum, dt_out, states, final_states = stages.chunk_cumsum_state_passing_fwd(
        dt, A, B, x, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
        initial_states=initial_states, seq_idx=seq_idx, out_dtype=state_dtype or C.dtype)
    out, out_x = stages.bmm_chunk_scan_fwd(x, dt_out, dA_cumsum, B, C, states, D=D, z=z, seq_idx=seq_idx)
    return out, out_x, dt_out, dA_cumsum, states, final_states


def chain_chunk_state_passing_scan(stages: Any, x, dt, dA_cumsum, B, C, D=None, z=None, initial_states=None,
                                   seq_idx=None, state_dtype=None):
    """``chunk_state_passing_scan_fwd`` (one launch after chunk_cumsum where a GPU's rule says so) as the chained
    stages compute it: ``stages.chunk_state_passing_fwd``, then ``stages.bmm_chunk_scan_fwd`` on the states
    entering each chunk in ``state_dtype`` (default C's dtype). Returns (out, out_x or None, final_states fp32)."""
    states, final_states = stages.chunk_state_passing_fwd(B, x, dt, dA_cumsum, initial_states=initial_states,
                                                          seq_idx=seq_idx, out_dtype=state_dtype or C.dtype)
    out, out_x = stages.bmm_chunk_scan_fwd(x, dt, dA_cumsum, B, C, states, D=D, z=z, seq_idx=seq_idx)
    return out, out_x, final_states


def chain_ssd_fwd(stages: Any, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                  seq_idx=None, dt_softplus=False, dt_limit=(0.0, INF), state_dtype=None):
    """``ssd_fwd`` (chunk_cumsum, then the rest in one launch, where a GPU's rule says so) as the chained stages
    compute it: ``stages.chunk_cumsum_state_passing_fwd``, then ``stages.bmm_chunk_scan_fwd`` on the states
    entering each chunk in ``state_dtype`` (default C's dtype). Returns (out, out_x or None, final_states fp32)."""
    out, out_x, *_, final_states = _chained_forward(
        stages, x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
        seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=dt_limit, state_dtype=state_dtype)
    return out, out_x, final_states


def forward(stages: Any, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
            seq_idx=None, dt_softplus=False, dt_limit=(0.0, INF), cu_seqlens=None, state_dtype=None):
    """Returns (out, out_x or None, final_states fp32): ``stages.ssd_fwd``, which keeps none of the
    intermediates (the backward recomputes them). With cu_seqlens (batch 1: the caller checks it),
    varlen_states (num_seqs, h, p, n) in C's dtype is appended: ``stages.chunk_state_varlen`` over the states
    entering each chunk, so that call runs the two chained stages, which have those states in hand. The states
    entering each chunk are kept in ``state_dtype`` (default C's dtype), as mamba-ssm's main branch does (its
    #972); final_states are fp32 either way."""
    options = {"D": D, "z": z, "dt_bias": dt_bias, "initial_states": initial_states, "seq_idx": seq_idx,
               "dt_softplus": dt_softplus, "dt_limit": dt_limit, "state_dtype": state_dtype}
    if cu_seqlens is None:
        return stages.ssd_fwd(x, dt, A, B, C, chunk_size, **options)
    out, out_x, dt_out, dA_cumsum, states, final_states = _chained_forward(stages, x, dt, A, B, C, chunk_size,
                                                                           **options)
    varlen_states = stages.chunk_state_varlen(B[0], x[0], dt_out[0], dA_cumsum[0], cu_seqlens, states[0])
    return out, out_x, final_states, varlen_states


def backward(stages: Any, dout, x, dt, A, B, C, out, chunk_size, D=None, z=None, dt_bias=None,
             initial_states=None, dfinal_states=None, seq_idx=None, dt_softplus=False, dt_limit=(0.0, INF),
             dx=None, ddt=None, dB=None, dC=None, dz=None, state_dtype=None, cu_seqlens=None, dvarlen_states=None):
    """``_mamba_chunk_scan_combined_bwd``: recompute the forward stages, then the backward chain.

    ``out`` is the forward's pre-gate output when z is given, else its output. Returns
    (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states). The states and their gradients reach the later
    kernels in ``state_dtype`` (default x's dtype): the precision the forward kept them in.

    ``dvarlen_states`` (num_seqs, h, p, n), the gradient of the forward's varlen_states (with its
    ``cu_seqlens``; mamba-ssm has none): ``stages.chunk_state_varlen_bwd`` carries it to B, x, dt, dA_cumsum
    and the states entering each chunk, which join the other gradients of those before the stages that
    carry them further (the states' through the state pass, dA_cumsum's as dt's and A's).

    dx, ddt, dB, dC, dz: optional output buffers, each of its input's shape and dtype and any strides (such
    as slices of one layer gradient): the stage that computes a gradient writes it there, and the buffer is
    returned. The stages of ``mamba2_kernels.ssd.naive`` ignore them, as documented there."""
    for name, given, like in (("dx", dx, x), ("ddt", ddt, dt), ("dB", dB, B), ("dC", dC, C)):
        check_out(name, given, like.shape, like.dtype)
    if dz is not None:
        if z is None:
            raise ValueError("dz: given without z")
        check_out("dz", dz, z.shape, z.dtype)
    ngroups = B.shape[2]
    dA_cumsum, dt_out, states, _ = stages.chunk_cumsum_state_passing_fwd(
        dt, A, B, x, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
        initial_states=initial_states, seq_idx=seq_idx)
    varlen = None
    if dvarlen_states is not None:  # the forward's chunk_state_varlen, on the states in the dtype it kept them in
        varlen = stages.chunk_state_varlen_bwd(B[0], x[0], dt_out[0], dA_cumsum[0], cu_seqlens,
                                               states[0].to(state_dtype or C.dtype), dvarlen_states)
    dD = None
    if z is not None:
        dz, dout, dD = stages.chunk_scan_bwd_dz(x, z, out, dout, chunk_size, has_ddAcs=False, D=D, dz=dz)
    dstates, ddA_chunk_cumsum, dinitial_states, states = stages.chunk_state_passing_bwd(
        C, dA_cumsum, dout, states, dfinal_states=dfinal_states, seq_idx=seq_idx,
        has_initial_states=initial_states is not None, dstates_dtype=state_dtype or x.dtype,
        states_dtype=state_dtype or x.dtype, dstates_in=None if varlen is None else varlen[4][None])
    CB, dCB, ddA_intra = stages.bmm_chunk_scan_bwd_dcb(x, dt_out, dA_cumsum, dout, B, C, seq_idx=seq_idx,
                                                       ngroups=ngroups)
    dx, ddt_from_x, dD_from_x = stages.chunk_scan_chunk_state_bwd_dx(x, dt_out, dA_cumsum, B, CB, dout, dstates,
                                                                     D=D, seq_idx=seq_idx, dx=dx)
    if varlen is not None:
        dB_varlen, dx_varlen, ddt_varlen, ddA_cumsum_varlen, _ = varlen
        dx[0] += dx_varlen.to(dx.dtype)
        # dA_cumsum is the within-chunk cumsum of dA = dt_out * A: its gradient is dA's reversed cumsum, which
        # reaches dt_out (with the varlen states' own) and A.
        ddA_varlen = ddA_cumsum_varlen.flip(-1).cumsum(-1).flip(-1)
        ddt_from_x = ddt_from_x + (ddt_varlen + ddA_varlen * A[:, None, None]).to(ddt_from_x.dtype)
    dB, dC, ddA_next, ddA_cumsum_prev = stages.chunk_bwd_db_dc(x, dt_out, dA_cumsum, B, C, dout, states, dstates, dCB,
                                                               seq_idx=seq_idx, dB=dB, dC=dC)
    if z is None:
        dD = dD_from_x
    ddt, dA, ddt_bias = stages.chunk_cumsum_bwd_of_terms(ddA_intra, ddA_next, ddA_cumsum_prev, ddA_chunk_cumsum,
                                                         ddt_from_x, dt, A, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                                         dt_limit=dt_limit, ddt=ddt)
    if varlen is not None:
        dB[0] += dB_varlen.to(dB.dtype)
        dA = dA + (ddA_varlen * dt_out[0]).sum(dim=(1, 2)).to(dA.dtype)
    return dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states
