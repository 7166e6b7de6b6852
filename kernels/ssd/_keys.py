"""Shared helpers of the Helion SSD forward kernels: shape-key pieces and seq_idx views."""

from __future__ import annotations

import torch

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
