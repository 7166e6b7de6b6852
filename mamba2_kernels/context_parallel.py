"""Context parallelism for the SSD call and the whole Mamba-2 layer: a sequence split across the ranks of a
process group, each rank holding one contiguous slice in rank order, gives the outputs and gradients of the
whole sequence.

Each rank runs ``mamba_chunk_scan_combined`` on its slice from a zero state (rank 0 from the call's
``initial_states``). The SSD is linear in the state entering a slice, so the state the slice would have
started from is added afterwards: every rank all-gathers the slices' end states with their decays (one
differentiable ``torch.distributed`` all-gather of (batch, nheads, headdim, dstate) and (batch, nheads) per
rank; a second, of each row's first and last document numbers), composes the state
entering its own slice, and adds its contribution to the outputs of the slice's first document,
``C_t . exp(sum of A dt up to t) * state``, and to its end state. The state's gradient flows back through the
same all-gather (its backward sends each rank the gradient of its end state), so the gradients equal the
whole sequence's.

With ``seq_idx`` (packed documents, the same document numbers as the whole sequence's), a state passes from a
slice to the next only where the next slice starts inside the document the previous one ended in, and
through a slice only where the slice holds one document. ``z`` is applied after the correction, as the
gate ``y * silu(z)``. Not supported: ``cu_seqlens`` / ``return_varlen_states``.

    out = mamba_chunk_scan_combined_cp(x, dt, A, B, C, chunk_size, ..., group=None)

Returns this rank's slice of the output, then (``return_final_states``) the state at the end of this rank's
slice (on the last rank: the whole sequence's final state).

The layer (``mamba_split_conv1d_scan_combined_cp``) also needs, before its slice, the causal conv1d's window:
the last width - 1 positions of the conv's input that precede the slice, which may span several short
slices. An all-gather of every slice's last width - 1 positions (and one of their document numbers and the
slices' lengths) gives each rank that halo; the conv runs over halo and slice, and the halo's
gradient flows back to the ranks that own it. The rest of the layer is per position (the gated norm, the
SwiGLU, out_proj) or the SSD above. The weights' gradients are each rank's part: sum them over the group, as
data parallelism does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.nn.functional as F

from mamba2_kernels import layer_compose, layer_fn
from mamba2_kernels.conv.causal_conv1d import causal_conv1d_fn
from mamba2_kernels.ssd.combined import check_arguments, check_state_dtype, mamba_chunk_scan_combined
from mamba2_kernels.ssd.naive import dt_transform, exp_nonpos

INF = float("inf")


# torch.distributed's functional collectives: Dynamo traces them (torch.distributed.nn's all-gather breaks
# the graph), and their all-gather carries gradients. torch 2.13 renamed it; 2.11 and 2.12 have the old name.
_gather_with_grad = getattr(fc, "all_gather_single_autograd", None) or fc.all_gather_tensor_autograd


def _all_gather(tensor: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's ``tensor``, differentiable (its backward returns each rank the sum of the gradients that
    reached its tensor on all ranks)."""
    gathered = _gather_with_grad(tensor.contiguous().unsqueeze(0), 0, group or dist.group.WORLD)
    return list(gathered.unbind(0))


def _gather_ends(end: torch.Tensor, decay: torch.Tensor, group) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's end state (b, h, p, n) and decay (b, h), in one all-gather: one autograd node whose
    backward every rank reaches."""
    gathered = _all_gather(torch.cat([end.flatten(), decay.flatten()]), group)
    return ([g[:end.numel()].view(end.shape) for g in gathered], [g[end.numel():].view(decay.shape) for g in gathered])


def _rank_and_world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialized; call init_process_group first")
    return dist.get_rank(group), dist.get_world_size(group)


def _entering_state(ends, decays, continues, whole, rank: int) -> torch.Tensor:
    """The state entering slice ``rank``: slice r-1's end state plus, where slice r-1 is one document, the
    state entering it decayed through it; kept only where slice r starts in the document slice r-1 ended in.
    ``ends``, ``decays``, ``continues``, ``whole``: per rank, (b, h, p, n), (b, h), (b,), (b,). Rank 0's is
    zero, made from the gathered states all the same: every rank's backward must reach the all-gather's,
    which is a collective (a rank that skipped it would leave the others waiting)."""
    state = 0 * ends[0]
    for r in range(1, rank + 1):
        end = ends[r - 1] + (whole[r - 1][:, None] * decays[r - 1])[..., None, None] * state
        state = continues[r][:, None, None, None] * end
    return state


def mamba_chunk_scan_combined_cp(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                                 seq_idx=None, dt_softplus=False, dt_limit=(0.0, INF), return_final_states=False,
                                 group=None, state_dtype=None):
    """``mamba_chunk_scan_combined`` over a sequence split across ``group``'s ranks (module docstring): x, dt,
    B, C, z, seq_idx are this rank's slice (the same length on every rank is not required); A, D, dt_bias the
    same everywhere; initial_states is used on rank 0 only. state_dtype is the local call's (the end states
    exchanged between ranks are fp32 either way)."""
    check_arguments(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit)
    rank, world = _rank_and_world(group)
    batch, _, nheads, headdim = x.shape
    ngroups = B.shape[2]
    y, end = mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias,
                                       initial_states=initial_states if rank == 0 else None, seq_idx=seq_idx,
                                       dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=True,
                                       state_dtype=state_dtype)
    log_decay = torch.cumsum(dt_transform(dt.float(), None if dt_bias is None else dt_bias.float(), dt_softplus,
                                          dt_limit) * A.float(), dim=1)  # (b, L, h)
    if seq_idx is None:
        first_doc = last_doc = torch.zeros(batch, dtype=torch.int64, device=x.device)
        in_first_doc = None
    else:
        first_doc, last_doc = seq_idx[:, 0].long(), seq_idx[:, -1].long()
        in_first_doc = seq_idx == seq_idx[:, :1]  # (b, L)
    ends, decays = _gather_ends(end.float(), exp_nonpos(log_decay[:, -1]), group)
    docs = _all_gather(torch.stack([first_doc, last_doc]), group)
    continues = [torch.zeros(batch, device=x.device)] + [(docs[r][0] == docs[r - 1][1]).float()
                                                         for r in range(1, world)]
    whole = [(d[0] == d[1]).float() for d in docs]
    state = _entering_state(ends, decays, continues, whole, rank)
    # y[b, t, h, p] += exp(log_decay[b, t, h]) * sum_n C[b, t, g(h), n] * state[b, h, p, n]
    grouped = state.view(batch, ngroups, nheads // ngroups, headdim, -1)
    carried = torch.einsum("btgn,bgkpn->btgkp", C.float(), grouped).reshape(batch, -1, nheads, headdim)
    weight = exp_nonpos(log_decay)
    if in_first_doc is not None:
        weight = weight * in_first_doc[..., None]
    y = (y.float() + weight[..., None] * carried).to(y.dtype)
    end = end + (whole[rank][:, None] * decays[rank])[..., None, None] * state
    out = y if z is None else (y.float() * F.silu(z.float())).to(y.dtype)
    return (out, end) if return_final_states else out


def _halo(x: torch.Tensor, seq_idx: torch.Tensor | None, size: int, group) -> tuple[torch.Tensor,
                                                                                    torch.Tensor | None]:
    """The ``size`` positions of the conv's input (b, d, L) before this rank's slice, from the slices before it
    (a slice shorter than the halo gives all it has, and the ones before it the rest), zero before the
    sequence's start; and their document numbers (b, size), the padding's those of the positions after it, so
    that the row stays non-decreasing.

    Tensor ops alone, no slice length read on the host, so that torch.compile traces it: every rank's tail,
    zero-padded on the left to ``size``, is gathered; the columns that hold a position of a slice before this
    one are packed to the right of the halo (the last ``size`` of them), every other column adds into a column
    dropped afterwards. So each rank's halo, rank 0's too, is made from the gathered tails, and each rank's
    backward reaches the all-gather's, a collective."""
    rank, world = _rank_and_world(group)
    batch, dim, length = x.shape
    have = min(size, length)
    tail_docs = (torch.zeros(batch, size, dtype=torch.int64, device=x.device) if seq_idx is None else
                 F.pad(seq_idx[:, length - have:].long(), (size - have, 0)))
    tails = torch.stack(_all_gather(F.pad(x[..., length - have:], (size - have, 0)), group))  # (world, b, d, size)
    # Each tail's document numbers, then its length (b, size + 1), in one all-gather.
    meta = torch.stack(_all_gather(F.pad(tail_docs, (0, 1), value=have), group))  # (world, b, size + 1)
    docs, lengths = meta[..., :size], meta[:, :1, size]  # (world, b, size), (world, 1)
    column = torch.arange(size, device=x.device)
    valid = (column >= size - lengths) & (torch.arange(world, device=x.device)[:, None] < rank)  # (world, size)
    valid = valid.flatten()
    before = valid.flip(0).long().cumsum(0).flip(0)  # valid columns from each one to the end, itself included
    place = torch.where(valid & (before <= size), size - before, size)  # size: the dropped column
    halo = x.new_zeros(batch, dim, size + 1).index_add(-1, place, tails.permute(1, 2, 0, 3).flatten(2))[..., :size]
    if seq_idx is None:
        return halo, None
    filled = column >= size - valid.sum()  # the packed columns: the halo's last min(size, valid columns)
    halo_docs = torch.zeros(batch, size + 1, dtype=torch.int64, device=x.device).index_add(
        -1, place, torch.where(valid, docs.permute(1, 0, 2).flatten(1), 0))[:, :size]
    # Padding columns (none filled) take the first document after them: the first filled column's, or the slice's.
    first = torch.where(filled, halo_docs, torch.iinfo(torch.int64).max).amin(-1, keepdim=True)
    first = torch.minimum(first, seq_idx[:, :1].long())
    return halo, torch.where(filled, halo_docs, first).to(seq_idx.dtype)


class _SplitParts:
    """The layer's parts (``mamba2_kernels.layer_compose``) over a process group: the conv with its halo, the SSD
    call split as above, the gated norm as it is. A class: Dynamo cannot trace the making of a
    ``types.SimpleNamespace``."""

    norm = staticmethod(layer_fn.OPERATOR_PARTS.norm)

    def __init__(self, group) -> None:
        self.group = group

    def conv(self, x, weight, bias, seq_idx, activation):
        size = weight.shape[-1] - 1
        halo, halo_docs = _halo(x, seq_idx, size, self.group)
        docs = None if seq_idx is None else torch.cat([halo_docs, seq_idx], dim=-1)
        return causal_conv1d_fn(torch.cat([halo, x], dim=-1), weight, bias, seq_idx=docs,
                                activation=activation)[..., size:]

    def ssd(self, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit, state_dtype):
        return mamba_chunk_scan_combined_cp(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                            initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True,
                                            dt_limit=dt_limit, return_final_states=True, group=self.group,
                                            state_dtype=state_dtype)


def mamba_split_conv1d_scan_combined_cp(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                        initial_states=None, seq_idx=None, dt_limit=(0.0, INF),
                                        return_final_states=False, activation="silu", rmsnorm_weight=None,
                                        rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None,
                                        ngroups=1, norm_before_gate=True, state_dtype=None, group=None):
    """``mamba_split_conv1d_scan_combined`` over a sequence split across ``group``'s ranks (module docstring):
    zxbcdt and seq_idx are this rank's slice (any length, one position too); the weights the same everywhere,
    their gradients this rank's part; initial_states is used on rank 0 only. Returns this rank's slice of the
    output, then (``return_final_states``) the state at the end of the slice (on the last rank: the whole
    sequence's)."""
    layer_fn.layer_dims(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx,
                        dt_limit, activation, rmsnorm_weight, outproj_weight, outproj_bias, headdim, ngroups)
    check_state_dtype(state_dtype)
    _rank_and_world(group)
    return layer_compose.mamba_split_conv1d_scan(
        _SplitParts(group), zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx,
        dt_limit, return_final_states, activation, rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias,
        headdim, ngroups, norm_before_gate, state_dtype)
