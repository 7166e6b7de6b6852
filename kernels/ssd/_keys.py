"""Shared helpers of the Helion SSD kernels: shape-key pieces, seq_idx views, the head-split tunable."""

from __future__ import annotations

import torch
from helion.autotuner import EnumFragment

from kernels.config_store import tokens_bucket

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
                torch.float64: "float64"}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


def tokens(batch: int, seqlen: int) -> int:
    return tokens_bucket(batch * seqlen)


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


MAX_HEAD_SPLITS = 4


def heads_per_program(hpg: int) -> EnumFragment:
    """The choices for how many heads of a group one program handles: the divisors of ``hpg`` that split a
    group in at most ``MAX_HEAD_SPLITS`` parts, largest first, so that the default config (Helion's is the
    first choice) splits no group. Every split adds a full-size fp32 partial for the host to sum, a cost
    the tuner, which times the kernel alone, does not see: at nemotron3-nano (hpg 8) one head per program
    made dCB's partials 0.54 GB to write and read back, 8x the output, and the tuner chose it. mamba-ssm's
    SM-count rule splits in at most 2 parts at the suite shapes."""
    return EnumFragment(tuple(d for d in range(hpg, 0, -1) if hpg % d == 0 and hpg // d <= MAX_HEAD_SPLITS))
