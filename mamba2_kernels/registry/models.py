"""Bytes and FLOPs models: compulsory traffic (each input read once, each output written once) and the
multiply-adds of the matmuls, in the layouts the kernels use; the roofline fractions and the bring-up's order
of value come from them."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mamba2_kernels.suites import ShapeSpec


def sizes(s: ShapeSpec) -> dict[str, int]:
    el = torch.tensor([], dtype=s.torch_dtype).element_size()
    b, L, h, p, G, n, Q, c = s.batch, s.seqlen, s.nheads, s.headdim, s.ngroups, s.dstate, s.chunk_size, s.nchunks
    return {
        "el": el,
        "x": b * L * h * p * el,  # also z, dout, out, dx
        "bc": b * L * G * n * el,  # B or C
        "bc32": b * L * G * n * 4,
        "dt": b * h * c * Q * 4,  # dt, dA_cumsum
        "dt_raw": b * L * h * el,
        "states32": b * c * h * p * n * 4,
        "states": b * c * h * p * n * el,
        "final": b * h * p * n * 4,
        "cb": b * c * G * Q * Q * 4,
    }


def traffic(model: Callable[[dict[str, int]], int]) -> Callable[[ShapeSpec], int]:
    return lambda s: int(model(sizes(s)))


def flops_of(fn: Callable[..., int]) -> Callable[[ShapeSpec], int]:
    return lambda s: int(fn(s.batch, s.seqlen, s.nheads, s.headdim, s.ngroups, s.dstate, s.chunk_size, s.nchunks))


def norm_bytes(tensors: int) -> Callable[[ShapeSpec], int]:
    return lambda s: tensors * s.batch * s.seqlen * s.d_ssm * sizes(s)["el"]


def conv_bytes(tensors: int) -> Callable[[ShapeSpec], int]:
    return lambda s: tensors * s.batch * s.conv_dim * s.seqlen * sizes(s)["el"]



def varlen_bytes(s: ShapeSpec) -> int:
    """Each sequence reads its last chunk (x, B, dt, dA_cumsum) and one entering state, writes one state."""
    el, nseqs = sizes(s)["el"], 2 + s.batch * s.seqlen // 256
    h, p, n, Q = s.nheads, s.headdim, s.dstate, s.chunk_size
    return nseqs * (Q * (h * p + s.ngroups * n) * el + 2 * Q * h * 4 + 2 * h * p * n * el)
