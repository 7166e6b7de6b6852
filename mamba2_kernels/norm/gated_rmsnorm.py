"""Gated RMSNorm in Helion, forward and backward, with the wrapper signatures and semantics of mamba-ssm's
``_layer_norm_fwd`` / ``_layer_norm_bwd`` (``mamba_ssm/ops/triton/layernorm_gated.py``), RMS case:

    y = rmsnorm(x * silu(z)) * w + b        (norm_before_gate=False)
    y = (rmsnorm(x) * w + b) * silu(z)      (norm_before_gate=True)

over groups of ``group_size`` features; ``rstd`` is fp32, group-major, shape (ngroups * M,).

The kernels see x, z, dy as (M, ngroups, group_size) views and tile rows x groups, each program holding
whole groups. The backward's parallelism is a tuned block size, not derived from the SM count: the rows
are cut into chunks of ``m_block`` rows (``hl.register_block_size``); each (chunk, group tile) program
walks its rows in sub-tiles and keeps fp32 partial sums of dw (and db), written to row ``chunk`` of a
(nchunks, ngroups, group_size) buffer, then summed on the host side. No atomics: deterministic.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from mamba2_kernels._buffers import check_out
from mamba2_kernels._runtime import tuned_kernel
from mamba2_kernels.config_store import ShapeKey, tokens_bucket

__all__ = ["gated_rmsnorm_fwd", "gated_rmsnorm_bwd", "gated_rmsnorm_fwd_kernel", "gated_rmsnorm_bwd_kernel"]


def _gate_mode(z, norm_before_gate) -> str:
    if z is None:
        return "none"
    return "before" if norm_before_gate else "after"


def _fwd_key(x, z, weight, bias, eps, norm_before_gate) -> ShapeKey:
    return ShapeKey.of(dtype=str(x.dtype).removeprefix("torch."), group_size=int(x.shape[2]),
                       gate=_gate_mode(z, norm_before_gate), bias=int(bias is not None),
                       tokens=tokens_bucket(x.shape[0]))


def _bwd_key(dy, x, z, weight, bias, rstd, dz, norm_before_gate) -> ShapeKey:
    return ShapeKey.of(dtype=str(x.dtype).removeprefix("torch."), group_size=int(x.shape[2]),
                       gate=_gate_mode(z, norm_before_gate), bias=int(bias is not None),
                       tokens=tokens_bucket(x.shape[0]))


@tuned_kernel(name="gated_rmsnorm_fwd", shape_key=_fwd_key)
def gated_rmsnorm_fwd_kernel(
    x: torch.Tensor,  # (M, ngroups, G)
    z: torch.Tensor | None,  # (M, ngroups, G) or None
    weight: torch.Tensor,  # (ngroups, G)
    bias: torch.Tensor | None,  # (ngroups, G) or None
    eps: float,
    norm_before_gate: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor]:
    M, ngroups, G = x.size()
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32  # compute dtype
    G = hl.specialize(G)
    out = torch.empty_like(x)
    rstd = torch.empty([ngroups, M], dtype=cdt, device=x.device)
    for tile_m, tile_g in hl.tile([M, ngroups]):
        xv = x[tile_m, tile_g, :].to(cdt)
        if z is not None:
            zv = z[tile_m, tile_g, :].to(cdt)
            if not norm_before_gate:
                xv = xv * zv * torch.sigmoid(zv)
        r = torch.rsqrt(torch.mean(xv * xv, dim=-1) + eps)
        y = xv * r[:, :, None] * weight[tile_g, :].to(cdt)[None, :, :]
        if bias is not None:
            y = y + bias[tile_g, :].to(cdt)[None, :, :]
        if z is not None:  # noqa: SIM102 - Helion specializes each test separately
            if norm_before_gate:
                y = y * zv * torch.sigmoid(zv)
        out[tile_m, tile_g, :] = y.to(out.dtype)
        rstd[tile_g, tile_m] = r.permute(1, 0)
    return out, rstd


@tuned_kernel(name="gated_rmsnorm_bwd", shape_key=_bwd_key)
def gated_rmsnorm_bwd_kernel(
    dy: torch.Tensor,  # (M, ngroups, G)
    x: torch.Tensor,  # (M, ngroups, G)
    z: torch.Tensor | None,  # (M, ngroups, G) or None
    weight: torch.Tensor,  # (ngroups, G)
    bias: torch.Tensor | None,  # (ngroups, G) or None
    rstd: torch.Tensor,  # (ngroups, M) fp32
    dz: torch.Tensor | None,  # (M, ngroups, G), written; None without z
    norm_before_gate: hl.constexpr,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    M, ngroups, G = x.size()
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32  # compute dtype
    G = hl.specialize(G)
    m_block = hl.register_block_size(M)
    nchunks = helion.cdiv(M, m_block)
    dx = torch.empty_like(x)
    dw_part = torch.empty([nchunks, ngroups, G], dtype=cdt, device=x.device)
    if bias is not None:
        db_part = torch.empty([nchunks, ngroups, G], dtype=cdt, device=x.device)
    else:
        db_part = torch.zeros([1, ngroups, G], dtype=cdt, device=x.device)
    for tile_c, tile_g in hl.tile([M, ngroups], block_size=[m_block, None]):
        acc_w = hl.zeros([tile_g, G], dtype=cdt)
        acc_b = hl.zeros([tile_g, G], dtype=cdt)
        w = weight[tile_g, :].to(cdt)[None, :, :]
        for tile_m in hl.tile(tile_c.begin, tile_c.end):
            xv = x[tile_m, tile_g, :].to(cdt)
            dyv = dy[tile_m, tile_g, :].to(cdt)
            r = rstd[tile_g, tile_m].permute(1, 0)[:, :, None]
            xg = xv
            if z is not None:
                zv = z[tile_m, tile_g, :].to(cdt)
                sig = torch.sigmoid(zv)
                if not norm_before_gate:
                    xg = xv * zv * sig
            xhat = xg * r
            if z is not None:  # noqa: SIM102
                if norm_before_gate:
                    y = xhat * w
                    if bias is not None:
                        y = y + bias[tile_g, :].to(cdt)[None, :, :]
                    dz[tile_m, tile_g, :] = (dyv * y * sig * (1.0 + zv * (1.0 - sig))).to(dz.dtype)
                    dyv = dyv * zv * sig
            wdy = w * dyv
            c1 = torch.mean(xhat * wdy, dim=-1)
            dxv = (wdy - xhat * c1[:, :, None]) * r
            acc_w = acc_w + torch.sum(dyv * xhat, dim=0)
            if bias is not None:
                acc_b = acc_b + torch.sum(dyv, dim=0)
            if z is not None:  # noqa: SIM102
                if not norm_before_gate:
                    dz[tile_m, tile_g, :] = (dxv * xv * sig * (1.0 + zv * (1.0 - sig))).to(dz.dtype)
                    dxv = dxv * zv * sig
            dx[tile_m, tile_g, :] = dxv.to(dx.dtype)
        dw_part[tile_c.id, tile_g, :] = acc_w
        if bias is not None:
            db_part[tile_c.id, tile_g, :] = acc_b
    # The partial sums' shape depends on the config; their sum does not (autotuner accuracy checks).
    return dx, dz, dw_part.sum(0), db_part.sum(0)


def _check(x, weight, bias, z, group_size, is_rms_norm):
    if not is_rms_norm:
        raise NotImplementedError("is_rms_norm=False: only the RMS variant is used by Mamba-2")
    if x.dim() != 2:
        raise ValueError(f"x: expected (M, N), got shape {tuple(x.shape)}")
    M, N = x.shape
    group_size = group_size or N
    if N % group_size:
        raise ValueError(f"group_size {group_size} does not divide N={N}")
    if weight.shape != (N,):
        raise ValueError(f"weight: expected shape ({N},), got {tuple(weight.shape)}")
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias: expected shape ({N},), got {tuple(bias.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z: expected shape {tuple(x.shape)}, got {tuple(z.shape)}")
    return M, N, group_size, N // group_size


def _rows(t, M, ngroups, group_size):
    # Rows may be strided (z is a column slice of the layer's in_proj output): the kernels read them in
    # place, sparing a copy of the whole input per call.
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t.view(M, ngroups, group_size)


def gated_rmsnorm_fwd(x, weight, bias, eps, z=None, out=None, group_size=None, norm_before_gate=True,
                      is_rms_norm=True):
    """(out, None, rstd): mamba-ssm ``_layer_norm_fwd`` with ``is_rms_norm=True``."""
    M, N, group_size, ngroups = _check(x, weight, bias, z, group_size, is_rms_norm)
    x3 = _rows(x, M, ngroups, group_size)
    z3 = _rows(z, M, ngroups, group_size) if z is not None else None
    w2 = weight.contiguous().view(ngroups, group_size)
    b2 = bias.contiguous().view(ngroups, group_size) if bias is not None else None
    y3, rstd = gated_rmsnorm_fwd_kernel(x3, z3, w2, b2, float(eps), bool(norm_before_gate))
    y = y3.view(M, N)
    if out is not None:
        out.copy_(y)
        y = out
    return y, None, rstd.view(-1)


def gated_rmsnorm_bwd(dy, x, weight, bias, eps, mean, rstd, z=None, group_size=None, norm_before_gate=True,
                      is_rms_norm=True, dz=None):
    """(dx, dw, db, dz): mamba-ssm ``_layer_norm_bwd`` with ``is_rms_norm=True`` (``rstd`` as saved by the
    forward; ``eps`` and ``mean`` are unused, as there). A given ``dz`` (z's shape and dtype, rows may be
    strided, such as a slice of the layer's input gradient) is filled by the kernel and returned."""
    M, N, group_size, ngroups = _check(x, weight, bias, z, group_size, is_rms_norm)
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected shape {tuple(x.shape)}, got {tuple(dy.shape)}")
    if dz is not None:
        if z is None:
            raise ValueError("dz: given without z")
        check_out("dz", dz, x.shape, z.dtype, unit_stride_dim=-1)  # written through _rows' view, not a copy
    elif z is not None:
        dz = torch.empty(x.shape, dtype=z.dtype, device=z.device)
    x3 = _rows(x, M, ngroups, group_size)
    dy3 = _rows(dy, M, ngroups, group_size)
    z3 = _rows(z, M, ngroups, group_size) if z is not None else None
    w2 = weight.contiguous().view(ngroups, group_size)
    b2 = bias.contiguous().view(ngroups, group_size) if bias is not None else None
    r2 = rstd.contiguous().view(ngroups, M).to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    dz3 = _rows(dz, M, ngroups, group_size) if dz is not None else None
    dx3, _, dw, db = gated_rmsnorm_bwd_kernel(dy3, x3, z3, w2, b2, r2, dz3, bool(norm_before_gate))
    dw = dw.view(N).to(weight.dtype)
    db = db.view(N).to(bias.dtype) if bias is not None else None
    return dx3.view(M, N), dw, db, dz
