"""``mamba_chunk_scan_combined``: the drop-in for mamba-ssm 2.3.2.post1's function of the same name,
composed from the Helion SSD stages (chunk_cumsum -> chunk_state_passing (chunk_state and state_passing in
one pass) -> bmm_chunk -> chunk_scan, where chunk_cumsum joins the state pass, bmm_chunk and chunk_scan run as
one kernel and the state pass as two where the GPU's rules say so, as do the backward's bmm_chunk and dCB, and
its gradients of B and C: ``mamba2_kernels.ssd.fused_paths``).

Autograd: gradients for x, dt, A, B, C, D, z, dt_bias and initial_states (and through final_states)
with mamba-ssm's recomputation policy: the forward saves its inputs and the output (pre-gate output
when z is given); the backward recomputes chunk_cumsum, bmm_chunk and the states, then runs the Helion
backward kernels in the order of mamba-ssm's ``_mamba_chunk_scan_combined_bwd`` (with the fused stages that
``mamba2_kernels.ssd.compose`` lists).

Variable-length states, as in mamba-ssm: ``cu_seqlens`` is used only with ``return_varlen_states=True`` (and
ignored otherwise, unchecked, as mamba-ssm ignores it); then batch must be 1 and the call also returns
varlen_states (num_seqs, nheads, headdim, dstate) in state_dtype (default C's), the state at the end of each
sequence, from ``mamba2_kernels.ssd.chunk_state_varlen`` over the states entering each chunk. Pass seq_idx derived
from cu_seqlens (as Mamba2 does) for states that do not leak across sequences. Checking cu_seqlens' values costs one
device-to-host copy. As in mamba-ssm 2.3.2.post1, initial_states reach sequence 0's varlen state only when
that sequence does not end in chunk 0. Return order: out[, final_states], varlen_states.
Gradients: mamba-ssm refuses any backward after ``return_varlen_states=True`` (an assert in its backward).
Ours gives out's and final_states' gradients exactly as without it, and a gradient reaching varlen_states
flows back to x, dt, A, B, dt_bias and initial_states (``mamba2_kernels.ssd.compose.backward``; its own part
is PyTorch, ``naive.chunk_state_varlen_bwd``, and it takes the state pass's chain).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Sequence

import torch

from mamba2_kernels import _environ, seen
from mamba2_kernels._ops import differentiable, eager_or_operator, placed, present
from mamba2_kernels.ssd import compose, naive
from mamba2_kernels.ssd._keys import dtype_name
from mamba2_kernels.ssd.chunk_cumsum_bwd import chunk_cumsum_bwd_of_terms
from mamba2_kernels.ssd.chunk_scan_bwd import chunk_scan_bwd_dz
from mamba2_kernels.ssd.chunk_scan_chunk_state_bwd import chunk_scan_chunk_state_bwd_dx
from mamba2_kernels.ssd.chunk_state_varlen import chunk_state_varlen
from mamba2_kernels.ssd.fused_paths import (
    bmm_chunk_scan_bwd_dcb,
    bmm_chunk_scan_fwd,
    chunk_bwd_db_dc,
    chunk_cumsum_state_passing_fwd,
    chunk_state_passing_bwd,
    ssd_fwd,
)

INF = float("inf")


def check_chunk_size(chunk_size) -> None:
    """A positive power of two, before any kernel runs: the chunk_scan and dx kernels tile the chunk so
    (mamba-ssm's also take other lengths; every public Mamba-2 model chunks by 128 or 256)."""
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")
    if chunk_size & (chunk_size - 1):
        raise NotImplementedError(f"chunk_size: only powers of two are supported, got {chunk_size}")


IO_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what the kernels compute in


def check_tensors(io: tuple[str, torch.Tensor], **others: torch.Tensor | None) -> None:
    """The contract every public call shares, errors naming the argument: the io tensor (``io``: name, tensor)
    in a dtype the kernels compute in, non-empty, on a device that runs kernels (not ``meta``); every other
    tensor given floating and on the same device. float64 or integer inputs used to fail deep inside a Helion
    kernel (a 160-line InternalError), an empty sequence with an unpacking error."""
    name, tensor = io
    if tensor.dtype not in IO_DTYPES:
        raise ValueError(f"{name}: expected float16, bfloat16 or float32, got {tensor.dtype}")
    if tensor.device.type == "meta":
        raise ValueError(f"{name}: on the meta device; expected a CUDA tensor (or CPU, reference mode)")
    if tensor.numel() == 0:
        raise ValueError(f"{name}: expected no empty dimension, got {tuple(tensor.shape)}")
    for other, value in others.items():
        if value is None:
            continue
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            raise ValueError(f"{other}: expected a floating tensor, got "
                             + (str(value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__))
        if value.device != tensor.device:
            raise ValueError(f"{other}: expected on {name}'s device {tensor.device}, got {value.device}")


def check_seq_idx(seq_idx: torch.Tensor | None, batch: int, seqlen: int, device: torch.device) -> None:
    """seq_idx: (batch, seqlen) integers on the io device, non-decreasing along each row (the documents of a
    packed row, in order). The order is checked on CPU tensors only: on a GPU it would take a device-to-host
    copy, which stalls an eager training step at every layer."""
    if seq_idx is None:
        return
    if not isinstance(seq_idx, torch.Tensor):
        raise ValueError(f"seq_idx: expected an integer tensor, got {type(seq_idx).__name__}")
    if tuple(seq_idx.shape) != (batch, seqlen):
        raise ValueError(f"seq_idx: expected {(batch, seqlen)}, got {tuple(seq_idx.shape)}")
    if seq_idx.is_floating_point() or seq_idx.is_complex() or seq_idx.dtype == torch.bool:
        raise ValueError(f"seq_idx: expected an integer tensor (int32), got {seq_idx.dtype}")
    if seq_idx.device != device:
        raise ValueError(f"seq_idx: expected on the device {device}, got {seq_idx.device}")
    checkable = seq_idx.device.type == "cpu" and seqlen > 1 and not torch.compiler.is_compiling()
    if checkable and not bool((seq_idx[:, 1:] >= seq_idx[:, :-1]).all()):
        raise ValueError("seq_idx: expected non-decreasing document indices along each row")


def check_arguments(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit) -> None:
    """The shape contract of mamba_chunk_scan_combined, with errors naming the argument."""
    if not (isinstance(x, torch.Tensor) and x.dim() == 4):
        raise ValueError(f"x: expected (batch, seqlen, nheads, headdim), got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    check_tensors(("x", x), dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states)
    batch, seqlen, nheads, headdim = x.shape
    check_chunk_size(chunk_size)
    if tuple(dt.shape) != (batch, seqlen, nheads):
        raise ValueError(f"dt: expected {(batch, seqlen, nheads)}, got {tuple(dt.shape)}")
    if tuple(A.shape) != (nheads,):
        raise ValueError(f"A: expected ({nheads},), got {tuple(A.shape)}")
    if not (B.dim() == 4 and B.shape[:2] == (batch, seqlen)):
        raise ValueError(f"B: expected (batch={batch}, seqlen={seqlen}, ngroups, dstate), got {tuple(B.shape)}")
    ngroups = B.shape[2]
    if nheads % ngroups != 0:
        raise ValueError(f"B: ngroups ({ngroups}) must divide nheads ({nheads})")
    if C.shape != B.shape:
        raise ValueError(f"C: expected the shape of B {tuple(B.shape)}, got {tuple(C.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z: expected the shape of x {tuple(x.shape)}, got {tuple(z.shape)}")
    if D is not None and tuple(D.shape) not in {(nheads,), (nheads, headdim)}:
        raise ValueError(f"D: expected ({nheads},) or ({nheads}, {headdim}), got {tuple(D.shape)}")
    if dt_bias is not None and tuple(dt_bias.shape) != (nheads,):
        raise ValueError(f"dt_bias: expected ({nheads},), got {tuple(dt_bias.shape)}")
    if initial_states is not None:
        expected = (batch, nheads, headdim, B.shape[3])
        if tuple(initial_states.shape) != expected:
            raise ValueError(f"initial_states: expected {expected}, got {tuple(initial_states.shape)}")
    check_seq_idx(seq_idx, batch, seqlen, x.device)
    if not (len(dt_limit) == 2 and dt_limit[0] <= dt_limit[1]):
        raise ValueError(f"dt_limit: expected (low, high) with low <= high, got {dt_limit!r}")


STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_state_dtype(state_dtype) -> None:
    """``state_dtype``: None (the inputs' dtype) or a dtype the kernels keep states in."""
    if state_dtype is not None and state_dtype not in STATE_DTYPES:
        raise ValueError(f"state_dtype: expected None or one of {', '.join(map(str, STATE_DTYPES))}, "
                         f"got {state_dtype!r}")


def check_cu_seqlens(x, cu_seqlens) -> None:
    """cu_seqlens for return_varlen_states: given, batch 1, a 1-D integer tensor on x's device. Its values
    (``check_cu_seqlens_values``) are checked where the forward runs, inside the operator."""
    if cu_seqlens is None:
        raise ValueError("return_varlen_states: cu_seqlens must be provided if return_varlen_states is True")
    batch = x.shape[0]
    if batch != 1:
        raise ValueError(f"cu_seqlens: passing cu_seqlens to get the varlen states is only supported if batch "
                         f"dimension is 1, got batch {batch}")
    if not (isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 1
            and not cu_seqlens.is_floating_point() and not cu_seqlens.is_complex() and cu_seqlens.dtype != torch.bool):
        raise ValueError("cu_seqlens: expected a 1-D integer tensor (num_seqs + 1,), got "
                         + (f"{tuple(cu_seqlens.shape)} {cu_seqlens.dtype}" if isinstance(cu_seqlens, torch.Tensor)
                            else type(cu_seqlens).__name__))
    if cu_seqlens.device != x.device:
        raise ValueError(f"cu_seqlens: expected on x's device {x.device}, got {cu_seqlens.device}")


def check_cu_seqlens_values(cu_seqlens: torch.Tensor, seqlen: int) -> None:
    """0 = cu_seqlens[0] <= cu_seqlens[1] <= ... <= cu_seqlens[-1] = seqlen (one device-to-host copy)."""
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0:
        raise ValueError(f"cu_seqlens: expected to start at 0, got {bounds[0]}")
    if any(a > b for a, b in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets, got {bounds}")
    if bounds[-1] != seqlen:
        raise ValueError(f"cu_seqlens: expected to end at seqlen ({seqlen}), got {bounds[-1]}")


# The Helion stages, named as compose.forward/backward expect them; the ddA terms stay partials until the
# last stage sums them.
HELION_STAGES = types.SimpleNamespace(
    ssd_fwd=ssd_fwd, chunk_cumsum_state_passing_fwd=chunk_cumsum_state_passing_fwd,
    bmm_chunk_scan_fwd=bmm_chunk_scan_fwd,
    chunk_scan_bwd_dz=chunk_scan_bwd_dz, bmm_chunk_scan_bwd_dcb=bmm_chunk_scan_bwd_dcb,
    chunk_state_passing_bwd=chunk_state_passing_bwd, chunk_scan_chunk_state_bwd_dx=chunk_scan_chunk_state_bwd_dx,
    chunk_bwd_db_dc=chunk_bwd_db_dc,
    chunk_cumsum_bwd_of_terms=chunk_cumsum_bwd_of_terms,
    chunk_state_varlen=chunk_state_varlen, chunk_state_varlen_bwd=naive.chunk_state_varlen_bwd,
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


def _ssd_fwd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
             D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
             initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
             dt_softplus: bool, dt_limit: Sequence[float], return_final_states: bool,
             state_dtype: torch.dtype | None) -> list[torch.Tensor]:
    """The forward as one operator that torch.compile keeps whole (``_ssd_fwd_fake`` gives its outputs):
    [out, final_states, out_x (the pre-gate output, when z is given), varlen_states (with cu_seqlens)].
    ``return_final_states`` only tells the backward whether final_states can carry a gradient."""
    if cu_seqlens is not None:
        check_cu_seqlens_values(cu_seqlens, x.shape[1])
    with _environ.read_once(), seen.calling(**call_shape(x, dt, B, chunk_size, D, z, initial_states, seq_idx)):
        out, out_x, final_states, *varlen = ssd_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                                                        seq_idx, dt_softplus, tuple(dt_limit), cu_seqlens=cu_seqlens,
                                                        state_dtype=state_dtype)
    return present([out, final_states, out_x if z is not None else None, *varlen])


_ssd_fwd_op = torch.library.custom_op("mamba2_kernels::ssd_combined_fwd", _ssd_fwd, mutates_args=())


@_ssd_fwd_op.register_fake
def _ssd_fwd_fake(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                  dt_limit, return_final_states, state_dtype):
    batch, _, nheads, headdim = x.shape
    state = (nheads, headdim, B.shape[-1])
    varlen = (C.new_empty((cu_seqlens.shape[0] - 1, *state), dtype=state_dtype or C.dtype)
              if cu_seqlens is not None else None)
    out_x = torch.empty_like(x, memory_format=torch.contiguous_format) if z is not None else None
    return present([torch.empty_like(x, memory_format=torch.contiguous_format),
                    x.new_empty((batch, *state), dtype=torch.float32), out_x, varlen])


def _ssd_setup_context(ctx, inputs, output):
    x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_limit, \
        return_final_states, state_dtype = inputs
    ctx.save_for_backward(output[0] if z is None else output[2], x, dt, A, B, C, D, z, dt_bias, initial_states,
                          seq_idx, cu_seqlens)
    ctx.chunk_size, ctx.dt_softplus, ctx.dt_limit = chunk_size, dt_softplus, tuple(dt_limit)
    ctx.set_materialize_grads(False)  # an output no loss reached (varlen_states, say) gets None, not zeros
    ctx.return_final_states, ctx.state_dtype = return_final_states, state_dtype


def _ssd_backward(ctx, grads):
    out, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens = ctx.saved_tensors
    dout, dfinal_states, *rest = grads
    dvarlen_states = rest[-1] if len(rest) == (z is not None) + 1 else None
    if dout is None:  # a loss of the states alone
        dout = torch.zeros_like(out, memory_format=torch.contiguous_format)
    optional = (D, z, dt_bias, initial_states)
    dx, ddt, dA, dB, dC, *given = _ssd_bwd_call(
        dout, x, dt, A, B, C, out, ctx.chunk_size, D, z, dt_bias, initial_states,
        dfinal_states if ctx.return_final_states else None, dvarlen_states, cu_seqlens, seq_idx, ctx.dt_softplus,
        ctx.dt_limit, ctx.state_dtype)
    dD, dz, ddt_bias, dinitial_states = placed(given, optional)
    return (dx, ddt, dA, dB, dC, None, dD, dz, ddt_bias, dinitial_states, None, None, None, None, None, None)


def _ssd_bwd(dout: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, out: torch.Tensor, chunk_size: int, D: torch.Tensor | None, z: torch.Tensor | None,
             dt_bias: torch.Tensor | None, initial_states: torch.Tensor | None,
             dfinal_states: torch.Tensor | None, dvarlen_states: torch.Tensor | None,
             cu_seqlens: torch.Tensor | None, seq_idx: torch.Tensor | None, dt_softplus: bool,
             dt_limit: Sequence[float], state_dtype: torch.dtype | None) -> list[torch.Tensor]:
    """The backward as one operator: [dx, ddt, dA, dB, dC, then dD, dz, ddt_bias, dinitial_states for those of
    D, z, dt_bias, initial_states given]. ``out`` is the forward's pre-gate output when z is given;
    ``dvarlen_states`` the varlen states' gradient, with the forward's ``cu_seqlens``."""
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    with _environ.read_once(), seen.calling(**call_shape(x, dt, B, chunk_size, D, z, initial_states, seq_idx)):
        dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states = ssd_backward(
            dout, x, dt, A, B, C, out, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
            dfinal_states=dfinal_states, seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=tuple(dt_limit),
            state_dtype=state_dtype, cu_seqlens=cu_seqlens, dvarlen_states=dvarlen_states)
    if ddt_bias is not None:  # a view of dA's buffer (one reduction makes both); an operator's outputs must not alias
        ddt_bias = ddt_bias.clone()
    return [dx, ddt, dA, dB, dC, *present([dD, dz, ddt_bias, dinitial_states])]


_ssd_bwd_op = torch.library.custom_op("mamba2_kernels::ssd_combined_bwd", _ssd_bwd, mutates_args=())


@_ssd_bwd_op.register_fake
def _ssd_bwd_fake(dout, x, dt, A, B, C, out, chunk_size, D, z, dt_bias, initial_states, dfinal_states,
                  dvarlen_states, cu_seqlens, seq_idx, dt_softplus, dt_limit, state_dtype):
    return [torch.empty_like(t, memory_format=torch.contiguous_format)
            for t in present([x, dt, A, B, C, D, z, dt_bias, initial_states])]


_ssd_bwd_call = eager_or_operator(_ssd_bwd_op, _ssd_bwd)
_ssd_call = differentiable(_ssd_fwd_op, _ssd_fwd, _ssd_setup_context, _ssd_backward, grads_as_list=True)


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, INF),
                              return_final_states=False, return_varlen_states=False, state_dtype=None):
    """Same signature and semantics as ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``, with
    mamba-ssm's main-branch ``state_dtype`` (its #972, not in 2.3.2.post1).

    x: (batch, seqlen, nheads, headdim); dt: (batch, seqlen, nheads); A: (nheads,);
    B, C: (batch, seqlen, ngroups, dstate); D: (nheads, headdim) or (nheads,); z: like x;
    dt_bias: (nheads,); initial_states: (batch, nheads, headdim, dstate); seq_idx: (batch, seqlen).
    cu_seqlens: (num_seqs + 1,), used only if ``return_varlen_states`` (then batch must be 1).
    Returns out (batch, seqlen, nheads, headdim), then final_states (fp32) if ``return_final_states``, then
    varlen_states (num_seqs, nheads, headdim, dstate) in state_dtype (default C's) if ``return_varlen_states``.
    state_dtype: the dtype of the inter-chunk states the forward keeps and the backward reads (None: C's in the
    forward, x's in the backward, as in mamba-ssm); torch.float32 keeps them exact at the cost of their traffic.
    """
    check_arguments(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit)
    check_state_dtype(state_dtype)
    if return_varlen_states:
        check_cu_seqlens(x, cu_seqlens)
    else:
        cu_seqlens = None  # unused, as in mamba-ssm
    out, final_states, *rest = _ssd_call(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
        [float(v) for v in dt_limit], return_final_states, state_dtype)
    varlen_states = rest[-1] if return_varlen_states else None
    results = (out, *((final_states,) if return_final_states else ()),
               *((varlen_states,) if return_varlen_states else ()))
    return results if len(results) > 1 else out
