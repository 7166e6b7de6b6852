"""Shared helpers of the Helion SSD kernels: shape-key pieces, seq_idx and chunk views, the head-split tunable,
the host's sums of per-program partials."""

from __future__ import annotations

import torch
from helion.autotuner import EnumFragment

from mamba2_kernels.config_store import tokens_bucket

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
                torch.float64: "float64"}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


def tokens(batch: int, seqlen: int) -> int:
    return tokens_bucket(batch * seqlen)


def d_kind_of(D: torch.Tensor | None, nheads: int, headdim: int) -> int:
    """How D enters a kernel that adds D x: 0 none, 1 per head (h,), 2 per head and channel (h, p)."""
    if D is None:
        return 0
    assert D.shape in ((nheads,), (nheads, headdim))
    return 2 if D.dim() == 2 else 1


def check_power_of_two_chunk(kernel: str, chunk_size: int) -> None:
    """NotImplementedError naming ``kernel`` unless ``chunk_size`` is a power of two, as its chunk tiles need."""
    if chunk_size & (chunk_size - 1):
        raise NotImplementedError(f"{kernel}: chunk_size {chunk_size} is not a power of two")


def sum_partials(part: torch.Tensor, dim: int) -> torch.Tensor:
    """Per-program partial sums added along ``dim``; a single partial is returned as a view, no launch."""
    return part.select(dim, 0) if part.shape[dim] == 1 else part.sum(dim)


def exclusive_cumsum(steps: torch.Tensor) -> torch.Tensor:
    """[..., t] = sum of steps[..., u] over u < t."""
    return torch.cumsum(steps, dim=-1) - steps


def seq_last(seq_idx: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(b, c) int32: seq_idx at each chunk's last valid position."""
    seqlen = seq_idx.shape[1]
    last = seq_idx[:, chunk_size - 1::chunk_size]
    if seqlen % chunk_size:
        last = torch.cat([last, seq_idx[:, -1:]], dim=1)
    return last.to(torch.int32).contiguous()


def seq_prev(seq_idx: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(b, c) int32: seq_idx at the position before each chunk; 0 before chunk 0 (as mamba-ssm)."""
    last = seq_last(seq_idx, chunk_size)
    return torch.cat([torch.zeros_like(last[:, :1]), last[:, :-1]], dim=1).contiguous()


def by_chunk(t: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(b, L, ...) -> (b, nchunks, chunk_size, ...): a view, or a zero-padded copy when chunk_size does not divide
    L, so that a kernel can take a whole chunk as one tile."""
    batch, seqlen = t.shape[:2]
    pad = -seqlen % chunk_size
    if pad:
        t = torch.cat([t, t.new_zeros((batch, pad, *t.shape[2:]))], dim=1)
    return t.view(batch, (seqlen + pad) // chunk_size, chunk_size, *t.shape[2:])


def carry_decay_log(dA_chunk_cumsum: torch.Tensor, seq_idx: torch.Tensor | None, chunk_size: int) -> torch.Tensor:
    """(b, h, c) contiguous: the log of the decay of the state carried into each chunk's end, dA_cumsum[..., -1],
    and -inf (exp(-inf) = 0) where seq_idx drops the carry: where a chunk's last position is in another
    sequence than the position before the chunk (sequence 0 before chunk 0), as mamba-ssm's state passing."""
    if seq_idx is None:
        return dA_chunk_cumsum.contiguous()
    keep = seq_last(seq_idx, chunk_size) == seq_prev(seq_idx, chunk_size)  # (b, c)
    return dA_chunk_cumsum.masked_fill(~keep[:, None, :], float("-inf")).contiguous()


MAX_HEAD_SPLITS = 4


def heads_per_program(hpg: int) -> EnumFragment:
    """The choices for how many heads of a group one program handles: the divisors of ``hpg`` that split a
    group in at most ``MAX_HEAD_SPLITS`` parts, largest first, so that the default config (Helion's is the
    first choice) splits no group. Every split adds a full-size fp32 partial for the host to sum, a cost
    the tuner, which times the kernel alone, does not see: with 8 heads per group, one head per program
    makes dCB's partials 8x the output to write and read back, and the tuner chose it. mamba-ssm's
    SM-count rule splits in at most 2 parts at the suite shapes."""
    return EnumFragment(tuple(d for d in range(hpg, 0, -1) if hpg % d == 0 and hpg // d <= MAX_HEAD_SPLITS))
