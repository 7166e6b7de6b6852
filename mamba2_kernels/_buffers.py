"""Output buffers: those handed in by the caller (mamba-ssm's ``dx=``, ``dz=``, ``ddt=``, ``out=``...), often
strided slices of one larger gradient, checked before a kernel writes into them, since a kernel fills a wrong one
silently wrong, or a copy of it instead of it; and those the kernels allocate, contiguous (``empty_dense``)."""

from __future__ import annotations

import torch


def check_out(name: str, given: torch.Tensor | None, shape, dtype: torch.dtype | None,
              unit_stride_dim: int | None = None) -> None:
    """ValueError naming ``name`` unless ``given`` (None passes) has ``shape`` and ``dtype`` (None: any
    floating dtype) and, with ``unit_stride_dim``, stride 1 along that dimension."""
    if given is None:
        return
    shape = tuple(shape)
    if not isinstance(given, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor of shape {shape}, got {type(given).__name__}")
    dtype_ok = given.is_floating_point() if dtype is None else given.dtype == dtype
    stride_ok = unit_stride_dim is None or given.stride(unit_stride_dim) == 1
    if tuple(given.shape) != shape or not dtype_ok or not stride_ok:
        wanted = "floating-point" if dtype is None else str(dtype)
        layout = "" if unit_stride_dim is None else f" with stride 1 in dim {unit_stride_dim}"
        raise ValueError(f"{name}: expected a {wanted} tensor of shape {shape}{layout}, got {given.dtype} "
                         f"{tuple(given.shape)} strides {given.stride()}")


def empty_dense(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``like``'s shape and dtype: an operator's output as its fake function
    promises it (and as mamba-ssm's kernels allocate it). ``torch.empty_like`` follows a permuted input's layout
    (a slice of a transposed buffer, say), which a compiled graph would then read with the promised strides."""
    return torch.empty_like(like, memory_format=torch.contiguous_format)
