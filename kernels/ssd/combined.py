"""``mamba_chunk_scan_combined``: the drop-in for mamba-ssm 2.3.2.post1's function of the same name,
composed from the Helion SSD stages (chunk_cumsum -> chunk_state -> state_passing -> bmm_chunk ->
chunk_scan).

Forward only for now: gradients through it raise until the backward kernels land. Arguments it does
not support (``cu_seqlens``, ``return_varlen_states``) raise ``NotImplementedError`` naming them.
"""

from __future__ import annotations

import torch

from kernels.ssd.bmm_chunk import bmm_chunk_fwd
from kernels.ssd.chunk_cumsum import chunk_cumsum_fwd
from kernels.ssd.chunk_scan import chunk_scan_fwd
from kernels.ssd.chunk_state import chunk_state_fwd
from kernels.ssd.state_passing import state_passing_fwd

INF = float("inf")


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_arguments(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit) -> None:
    """The shape contract of mamba_chunk_scan_combined, with errors naming the argument."""
    _expect(isinstance(x, torch.Tensor) and x.dim() == 4, f"x: expected (batch, seqlen, nheads, headdim), got "
            f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    batch, seqlen, nheads, headdim = x.shape
    _expect(isinstance(chunk_size, int) and chunk_size > 0,
            f"chunk_size: expected a positive int, got {chunk_size!r}")
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
    if seq_idx is not None:
        _expect(tuple(seq_idx.shape) == (batch, seqlen),
                f"seq_idx: expected {(batch, seqlen)}, got {tuple(seq_idx.shape)}")
    _expect(len(dt_limit) == 2 and dt_limit[0] <= dt_limit[1],
            f"dt_limit: expected (low, high) with low <= high, got {dt_limit!r}")


def ssd_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                dt_softplus=False, dt_limit=(0.0, INF)):
    """The five forward stages; returns (out, out_x, dt, dA_cumsum, states, final_states) as mamba-ssm's
    ``_mamba_chunk_scan_combined_fwd``."""
    batch, seqlen, nheads, headdim = x.shape
    dstate = B.shape[-1]
    dA_cumsum, dt = chunk_cumsum_fwd(dt, A, chunk_size, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    states = chunk_state_fwd(B, x, dt, dA_cumsum, seq_idx=seq_idx, states_in_fp32=True)
    flat_initial = initial_states.reshape(batch, nheads, headdim * dstate) if initial_states is not None else None
    states, final_states = state_passing_fwd(
        states.reshape(*states.shape[:3], headdim * dstate), dA_cumsum[:, :, :, -1], initial_states=flat_initial,
        seq_idx=seq_idx, chunk_size=chunk_size, out_dtype=C.dtype)
    states = states.reshape(*states.shape[:3], headdim, dstate)
    final_states = final_states.reshape(batch, nheads, headdim, dstate)
    cb = bmm_chunk_fwd(C, B, chunk_size, seq_idx=seq_idx, output_dtype=torch.float32)
    out, out_x = chunk_scan_fwd(cb, x, dt, dA_cumsum, C, states, D=D, z=z, seq_idx=seq_idx)
    return out, out_x, dt, dA_cumsum, states, final_states


class _ForwardOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_limit,
                return_final_states):
        out, _, _, _, _, final_states = ssd_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                                                    seq_idx, dt_softplus, dt_limit)
        return (out, final_states) if return_final_states else out

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError(
            "kernels.mamba_chunk_scan_combined: the backward pass is not implemented yet (forward only). "
            "Train with mamba_ssm's mamba_chunk_scan_combined until the Helion backward kernels land."
        )


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, INF),
                              return_final_states=False, return_varlen_states=False):
    """Same signature and semantics as ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``.

    x: (batch, seqlen, nheads, headdim); dt: (batch, seqlen, nheads); A: (nheads,);
    B, C: (batch, seqlen, ngroups, dstate); D: (nheads, headdim) or (nheads,); z: like x;
    dt_bias: (nheads,); initial_states: (batch, nheads, headdim, dstate); seq_idx: (batch, seqlen).
    Returns out (batch, seqlen, nheads, headdim), and final_states (fp32) if ``return_final_states``.
    """
    if cu_seqlens is not None:
        raise NotImplementedError("cu_seqlens: variable-length states are not supported by the Helion kernels yet")
    if return_varlen_states:
        raise NotImplementedError("return_varlen_states: not supported by the Helion kernels yet")
    check_arguments(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit)
    return _ForwardOnly.apply(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus,
                              tuple(dt_limit), return_final_states)
