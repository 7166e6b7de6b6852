"""``mamba_chunk_scan_combined``: the drop-in for mamba-ssm 2.3.2.post1's function of the same name,
composed from the Helion SSD stages (chunk_cumsum -> chunk_state_passing (chunk_state and state_passing in
one pass, or as the two kernels where the GPU's rule says so: ``mamba2_kernels.ssd.state_paths``) -> bmm_chunk ->
chunk_scan).

Autograd: gradients for x, dt, A, B, C, D, z, dt_bias and initial_states (and through final_states)
with mamba-ssm's recomputation policy: the forward saves its inputs and the output (pre-gate output
when z is given); the backward recomputes chunk_cumsum, bmm_chunk and the states, then runs the Helion
backward kernels in the order of mamba-ssm's ``_mamba_chunk_scan_combined_bwd`` (with the fused stages that
``mamba2_kernels.ssd.compose`` lists).

Variable-length states, as in mamba-ssm: ``cu_seqlens`` is used only with ``return_varlen_states=True`` (and
ignored otherwise, unchecked, as mamba-ssm ignores it); then batch must be 1 and the call also returns
varlen_states (num_seqs, nheads, headdim, dstate) in C's dtype, the state at the end of each sequence, from
``mamba2_kernels.ssd.chunk_state_varlen`` over the states entering each chunk. Pass seq_idx derived from cu_seqlens
(as Mamba2 does) for states that do not leak across sequences. Checking cu_seqlens' values costs one
device-to-host copy. As in mamba-ssm 2.3.2.post1, initial_states reach sequence 0's varlen state only when
that sequence does not end in chunk 0. Return order: out[, final_states], varlen_states.
Gradients: mamba-ssm refuses any backward after ``return_varlen_states=True`` (an assert in its backward).
Ours gives out's and final_states' gradients exactly as without it, and raises NotImplementedError if a
gradient reaches varlen_states, which is not differentiated (never silently dropped).
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch

from mamba2_kernels import seen
from mamba2_kernels._runtime import eager_under_compile
from mamba2_kernels.ssd import compose
from mamba2_kernels.ssd._keys import dtype_name
from mamba2_kernels.ssd.bmm_chunk import bmm_chunk_fwd
from mamba2_kernels.ssd.bmm_chunk_bwd import bmm_chunk_bwd
from mamba2_kernels.ssd.chunk_cumsum import chunk_cumsum_fwd
from mamba2_kernels.ssd.chunk_cumsum_bwd import chunk_cumsum_bwd_of_terms
from mamba2_kernels.ssd.chunk_scan import chunk_scan_fwd
from mamba2_kernels.ssd.chunk_scan_bwd import (
    chunk_scan_bwd_dC,
    chunk_scan_bwd_dcb,
    chunk_scan_bwd_dz,
)
from mamba2_kernels.ssd.chunk_scan_chunk_state_bwd import chunk_scan_chunk_state_bwd_dx
from mamba2_kernels.ssd.chunk_state_bwd import chunk_state_bwd_db
from mamba2_kernels.ssd.chunk_state_varlen import chunk_state_varlen
from mamba2_kernels.ssd.state_paths import chunk_state_passing_bwd, chunk_state_passing_fwd

INF = float("inf")


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_chunk_size(chunk_size) -> None:
    """A positive power of two, before any kernel runs: the chunk_scan and dx kernels tile the chunk so
    (mamba-ssm's also take other lengths; every public Mamba-2 model chunks by 128 or 256)."""
    _expect(isinstance(chunk_size, int) and chunk_size > 0,
            f"chunk_size: expected a positive int, got {chunk_size!r}")
    if chunk_size & (chunk_size - 1):
        raise NotImplementedError(f"chunk_size: only powers of two are supported, got {chunk_size}")


IO_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what the kernels compute in


def check_tensors(io: tuple[str, torch.Tensor], **others: torch.Tensor | None) -> None:
    """The contract every public call shares, errors naming the argument: the io tensor (``io``: name, tensor)
    in a dtype the kernels compute in, non-empty, on a device that runs kernels (not ``meta``); every other
    tensor given floating and on the same device. float64 or integer inputs used to fail deep inside a Helion
    kernel (a 160-line InternalError), an empty sequence with an unpacking error."""
    name, tensor = io
    _expect(tensor.dtype in IO_DTYPES, f"{name}: expected float16, bfloat16 or float32, got {tensor.dtype}")
    _expect(tensor.device.type != "meta", f"{name}: on the meta device; expected a CUDA tensor (or CPU, reference "
            "mode)")
    _expect(tensor.numel() > 0, f"{name}: expected no empty dimension, got {tuple(tensor.shape)}")
    for other, value in others.items():
        if value is None:
            continue
        _expect(isinstance(value, torch.Tensor) and value.is_floating_point(),
                f"{other}: expected a floating tensor, got "
                + (str(value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__))
        _expect(value.device == tensor.device, f"{other}: expected on {name}'s device {tensor.device}, got "
                f"{value.device}")


def check_seq_idx(seq_idx: torch.Tensor | None, batch: int, seqlen: int, device: torch.device) -> None:
    """seq_idx: (batch, seqlen) integers on the io device, non-decreasing along each row (the documents of a
    packed row, in order). The order is checked on CPU tensors only: on a GPU it would take a device-to-host
    copy, which stalls an eager training step at every layer."""
    if seq_idx is None:
        return
    _expect(isinstance(seq_idx, torch.Tensor), f"seq_idx: expected an integer tensor, got {type(seq_idx).__name__}")
    _expect(tuple(seq_idx.shape) == (batch, seqlen), f"seq_idx: expected {(batch, seqlen)}, got "
            f"{tuple(seq_idx.shape)}")
    _expect(not seq_idx.is_floating_point() and not seq_idx.is_complex() and seq_idx.dtype != torch.bool,
            f"seq_idx: expected an integer tensor (int32), got {seq_idx.dtype}")
    _expect(seq_idx.device == device, f"seq_idx: expected on the device {device}, got {seq_idx.device}")
    if seq_idx.device.type == "cpu" and seqlen > 1:
        _expect(bool((seq_idx[:, 1:] >= seq_idx[:, :-1]).all()),
                "seq_idx: expected non-decreasing document indices along each row")


def check_arguments(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit) -> None:
    """The shape contract of mamba_chunk_scan_combined, with errors naming the argument."""
    _expect(isinstance(x, torch.Tensor) and x.dim() == 4, f"x: expected (batch, seqlen, nheads, headdim), got "
            f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    check_tensors(("x", x), dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states)
    batch, seqlen, nheads, headdim = x.shape
    check_chunk_size(chunk_size)
    _expect(tuple(dt.shape) == (batch, seqlen, nheads),
            f"dt: expected {(batch, seqlen, nheads)}, got {tuple(dt.shape)}")
    _expect(tuple(A.shape) == (nheads,), f"A: expected ({nheads},), got {tuple(A.shape)}")
    _expect(B.dim() == 4 and B.shape[:2] == (batch, seqlen),
            f"B: expected (batch={batch}, seqlen={seqlen}, ngroups, dstate), got {tuple(B.shape)}")
    ngroups = B.shape[2]
    _expect(nheads % ngroups == 0, f"B: ngroups ({ngroups}) must divide nheads ({nheads})")
    _expect(C.shape == B.shape, f"C: expected the shape of B {tuple(B.shape)}, got {tuple(C.shape)}")
    if z is not None:
        _expect(z.shape == x.shape, f"z: expected the shape of x {tuple(x.shape)}, got {tuple(z.shape)}")
    if D is not None:
        _expect(tuple(D.shape) in {(nheads,), (nheads, headdim)},
                f"D: expected ({nheads},) or ({nheads}, {headdim}), got {tuple(D.shape)}")
    if dt_bias is not None:
        _expect(tuple(dt_bias.shape) == (nheads,), f"dt_bias: expected ({nheads},), got {tuple(dt_bias.shape)}")
    if initial_states is not None:
        expected = (batch, nheads, headdim, B.shape[3])
        _expect(tuple(initial_states.shape) == expected,
                f"initial_states: expected {expected}, got {tuple(initial_states.shape)}")
    check_seq_idx(seq_idx, batch, seqlen, x.device)
    _expect(len(dt_limit) == 2 and dt_limit[0] <= dt_limit[1],
            f"dt_limit: expected (low, high) with low <= high, got {dt_limit!r}")


def check_cu_seqlens(x, cu_seqlens) -> None:
    """cu_seqlens for return_varlen_states: given, batch 1, a 1-D integer tensor on x's device holding
    0 = cu_seqlens[0] <= cu_seqlens[1] <= ... <= cu_seqlens[-1] = seqlen (one device-to-host copy)."""
    _expect(cu_seqlens is not None,
            "return_varlen_states: cu_seqlens must be provided if return_varlen_states is True")
    batch, seqlen = x.shape[:2]
    _expect(batch == 1, f"cu_seqlens: passing cu_seqlens to get the varlen states is only supported if batch "
            f"dimension is 1, got batch {batch}")
    _expect(isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 1
            and not cu_seqlens.is_floating_point() and not cu_seqlens.is_complex() and cu_seqlens.dtype != torch.bool,
            "cu_seqlens: expected a 1-D integer tensor (num_seqs + 1,), got "
            + (f"{tuple(cu_seqlens.shape)} {cu_seqlens.dtype}" if isinstance(cu_seqlens, torch.Tensor)
               else type(cu_seqlens).__name__))
    _expect(cu_seqlens.device == x.device, f"cu_seqlens: expected on x's device {x.device}, got {cu_seqlens.device}")
    bounds = cu_seqlens.tolist()
    _expect(bounds[0] == 0, f"cu_seqlens: expected to start at 0, got {bounds[0]}")
    _expect(all(a <= b for a, b in zip(bounds, bounds[1:], strict=False)),
            f"cu_seqlens: expected non-decreasing offsets, got {bounds}")
    _expect(bounds[-1] == seqlen, f"cu_seqlens: expected to end at seqlen ({seqlen}), got {bounds[-1]}")


# The Helion stages, named as compose.forward/backward expect them; the ddA terms stay partials until the
# last stage sums them.
HELION_STAGES = types.SimpleNamespace(
    chunk_cumsum_fwd=chunk_cumsum_fwd, chunk_state_passing_fwd=chunk_state_passing_fwd,
    bmm_chunk_fwd=bmm_chunk_fwd, chunk_scan_fwd=chunk_scan_fwd, chunk_scan_bwd_dz=chunk_scan_bwd_dz,
    chunk_state_passing_bwd=chunk_state_passing_bwd, chunk_scan_chunk_state_bwd_dx=chunk_scan_chunk_state_bwd_dx,
    chunk_state_bwd_db=functools.partial(chunk_state_bwd_db, unfinished=True),
    chunk_scan_bwd_dC=functools.partial(chunk_scan_bwd_dC, unfinished=True),
    chunk_scan_bwd_dcb=functools.partial(chunk_scan_bwd_dcb, unfinished=True),
    bmm_chunk_bwd=bmm_chunk_bwd, chunk_cumsum_bwd_of_terms=chunk_cumsum_bwd_of_terms,
    chunk_state_varlen=chunk_state_varlen,
)
ssd_forward = functools.partial(compose.forward, HELION_STAGES)
ssd_backward = functools.partial(compose.backward, HELION_STAGES)


def call_shape(x, dt, B, chunk_size, D, z, initial_states, seq_idx) -> dict:
    """The call as a suite shape (``mamba2_kernels/suites.yaml``'s fields), for the seen-keys file: what ``mamba2-guard
    autotune --seen`` tunes. Packed documents count as 2 (their number would cost a device sync)."""
    batch, seqlen, nheads, headdim = x.shape
    pattern = {"z": z is not None, "docs": 2 if seq_idx is not None else 1,
               "D": "hp" if D is not None and D.dim() == 2 else "h", "initial_states": initial_states is not None}
    if dt.dtype != x.dtype:
        pattern["dt_dtype"] = dtype_name(dt.dtype)
    return {"batch": batch, "seqlen": seqlen, "nheads": nheads, "headdim": headdim, "ngroups": B.shape[2],
            "dstate": B.shape[3], "chunk_size": chunk_size, "dtype": dtype_name(x.dtype), "call": pattern}


class _MambaChunkScanCombinedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_limit,
                return_final_states, cu_seqlens):
        ctx.call = seen.current()
        out, out_x, _, _, _, final_states, *varlen = ssd_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias,
                                                                 initial_states, seq_idx, dt_softplus, dt_limit,
                                                                 cu_seqlens=cu_seqlens)
        ctx.save_for_backward(out if z is None else out_x, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx)
        ctx.chunk_size = chunk_size
        ctx.dt_softplus = dt_softplus
        ctx.dt_limit = dt_limit
        ctx.return_final_states = return_final_states
        ctx.return_varlen_states = cu_seqlens is not None
        if ctx.return_varlen_states:
            ctx.set_materialize_grads(False)  # so that an unused varlen_states brings no gradient
        results = (out, *((final_states,) if return_final_states else ()), *varlen)
        return results if len(results) > 1 else out

    @staticmethod
    def backward(ctx, dout, *rest):
        out, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx = ctx.saved_tensors
        dfinal_states = rest[0] if ctx.return_final_states else None
        if ctx.return_varlen_states:
            if rest[-1] is not None:
                raise NotImplementedError("varlen_states: gradients through varlen_states are not supported "
                                          "(mamba-ssm supports no backward at all with return_varlen_states)")
            if dout is None:  # only final_states is used
                dout = torch.zeros_like(out)
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        with seen.calling(**ctx.call) if ctx.call else contextlib.nullcontext():
            dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states = ssd_backward(
                dout, x, dt, A, B, C, out, ctx.chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                dfinal_states=dfinal_states, seq_idx=seq_idx, dt_softplus=ctx.dt_softplus, dt_limit=ctx.dt_limit)
        return (dx, ddt, dA, dB, dC, None, dD, dz, ddt_bias, dinitial_states, None, None, None, None, None)


@eager_under_compile
def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, INF),
                              return_final_states=False, return_varlen_states=False):
    """Same signature and semantics as ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``.

    x: (batch, seqlen, nheads, headdim); dt: (batch, seqlen, nheads); A: (nheads,);
    B, C: (batch, seqlen, ngroups, dstate); D: (nheads, headdim) or (nheads,); z: like x;
    dt_bias: (nheads,); initial_states: (batch, nheads, headdim, dstate); seq_idx: (batch, seqlen).
    cu_seqlens: (num_seqs + 1,), used only if ``return_varlen_states`` (then batch must be 1).
    Returns out (batch, seqlen, nheads, headdim), then final_states (fp32) if ``return_final_states``, then
    varlen_states (num_seqs, nheads, headdim, dstate) in C's dtype if ``return_varlen_states``.
    """
    check_arguments(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit)
    if return_varlen_states:
        check_cu_seqlens(x, cu_seqlens)
    else:
        cu_seqlens = None  # unused, as in mamba-ssm
    with seen.calling(**call_shape(x, dt, B, chunk_size, D, z, initial_states, seq_idx)):
        return _MambaChunkScanCombinedFn.apply(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                               dt_softplus, tuple(dt_limit), return_final_states, cu_seqlens)
