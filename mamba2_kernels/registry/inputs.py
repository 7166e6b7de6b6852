"""Seeded input factories, one per kind of call. Values follow what the layer produces: softplus-range dt,
negative A, dA cumulated within each chunk (so decays stay in (0, 1]), unit-scale activations."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mamba2_kernels.registry.entry import Inputs
from mamba2_kernels.suites import ShapeSpec

INF = float("inf")


def _rng(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _randn(g: torch.Generator, shape: Sequence[int], dtype: torch.dtype, device: torch.device, scale=1.0):
    return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * scale).to(dtype)


def _rand(g, shape, dtype, device, low, high):
    return (torch.rand(*shape, generator=g, device=device, dtype=torch.float32) * (high - low) + low).to(dtype)


def _ssd_base(s: ShapeSpec, seed: int, device: torch.device) -> Inputs:
    g = _rng(seed, device)
    b, L, h, p, n, G = s.batch, s.seqlen, s.nheads, s.headdim, s.dstate, s.ngroups
    dt_proc = _rand(g, (b, h, s.nchunks, s.chunk_size), torch.float32, device, 0.001, 0.1)
    A = -_rand(g, (h,), torch.float32, device, 1.0, 16.0)
    dA_cumsum = torch.cumsum(dt_proc * A[None, :, None, None], dim=-1)
    return {
        "g": g,
        "x": _randn(g, (b, L, h, p), s.torch_dtype, device),
        "dt_raw": _randn(g, (b, L, h), s.torch_dtype, device, 0.5) - 4.0,
        "A": A,
        "dt_bias": _rand(g, (h,), torch.float32, device, -4.0, -2.0),
        "B": _randn(g, (b, L, G, n), s.torch_dtype, device),
        "C": _randn(g, (b, L, G, n), s.torch_dtype, device),
        "D": _randn(g, (h,), torch.float32, device),
        "z": _randn(g, (b, L, h, p), s.torch_dtype, device),
        "dt": dt_proc,
        "dA_cumsum": dA_cumsum,
        "dout": _randn(g, (b, L, h, p), s.torch_dtype, device, 0.1),
        "chunk_size": s.chunk_size,
        "ngroups": G,
        "seq_idx": None,
        "dt_limit": (0.0, INF),
        "true": True,
        "false": False,
        "none": None,
        "fp32": torch.float32,
        "io_dtype": s.torch_dtype,
    }


def _states(s: ShapeSpec, g, device, dtype, flat: bool) -> torch.Tensor:
    shape = (s.batch, s.nchunks, s.nheads, s.headdim * s.dstate) if flat else (
        s.batch, s.nchunks, s.nheads, s.headdim, s.dstate)
    return _randn(g, shape, dtype, device)


def _cb(s: ShapeSpec, g, device) -> torch.Tensor:
    return _randn(g, (s.batch, s.nchunks, s.ngroups, s.chunk_size, s.chunk_size), torch.float32, device,
                  s.dstate ** 0.5)


def inputs_chunk_cumsum(s, seed, device):
    return _ssd_base(s, seed, device) | {"dt_softplus": True}


def inputs_chunk_state(s, seed, device):
    return _ssd_base(s, seed, device)


def inputs_state_passing(s, seed, device):
    base = _ssd_base(s, seed, device)
    base["states"] = _states(s, base["g"], device, torch.float32, flat=True)
    base["dA_chunk_cumsum"] = base["dA_cumsum"][..., -1].contiguous()
    return base


def inputs_chunk_state_varlen(s, seed, device):
    """The batch packed into one sequence of batch x seqlen tokens (varlen states need batch 1), cut into
    2 + tokens // 256 sequences with boundaries off the chunk edges; the states entering each chunk in the io
    dtype, as the forward passes them."""
    base = _ssd_base(s, seed, device)
    g, total, Q = base["g"], s.batch * s.seqlen, s.chunk_size
    nchunks, nseqs = -(-total // Q), 2 + total // 256
    dt = _rand(g, (s.nheads, nchunks, Q), torch.float32, device, 0.001, 0.1)
    bounds = [0, *(k * total // nseqs - k for k in range(1, nseqs)), total]
    return base | {
        "x": base["x"].reshape(total, s.nheads, s.headdim), "B": base["B"].reshape(total, s.ngroups, s.dstate),
        "dt": dt, "dA_cumsum": torch.cumsum(dt * base["A"][:, None, None], dim=-1),
        "cu_seqlens": torch.tensor(bounds, dtype=torch.int32, device=device),
        "chunk_states": _randn(g, (nchunks, s.nheads, s.headdim, s.dstate), s.torch_dtype, device),
    }




def inputs_chunk_state_passing_bwd(s, seed, device):
    base = _ssd_base(s, seed, device)
    base["states_fp32"] = _states(s, base["g"], device, torch.float32, flat=False)
    return base


def inputs_bmm_chunk(s, seed, device):
    return _ssd_base(s, seed, device)


def inputs_chunk_scan(s, seed, device):
    base = _ssd_base(s, seed, device)
    base["cb"] = _cb(s, base["g"], device)
    base["states"] = _states(s, base["g"], device, s.torch_dtype, flat=False)
    return base


def inputs_chunk_scan_bwd_dz(s, seed, device):
    base = _ssd_base(s, seed, device)
    base["out_x"] = _randn(base["g"], base["x"].shape, s.torch_dtype, device)
    base["D_per_dim"] = _randn(base["g"], (s.nheads, s.headdim), torch.float32, device)
    return base


def inputs_state_passing_bwd(s, seed, device):
    base = inputs_state_passing(s, seed, device)
    base["dstates_flat"] = _states(s, base["g"], device, torch.float32, flat=True) * 0.1
    return base


def inputs_bwd_with_states(s, seed, device):
    """For kernels that take the chunk-boundary states or their gradient, and CB."""
    base = _ssd_base(s, seed, device)
    base["cb"] = _cb(s, base["g"], device)
    base["dstates"] = _states(s, base["g"], device, s.torch_dtype, flat=False) * 0.1
    base["prev_states"] = _states(s, base["g"], device, s.torch_dtype, flat=False)
    return base


def inputs_db_dc(s, seed, device):
    """The fused dB and dC pass: the states and their gradient, and dCB."""
    base = inputs_bwd_with_states(s, seed, device)
    base["dcb"] = _cb(s, base["g"], device) * 0.01
    return base


def inputs_bmm_chunk_bwd(s, seed, device):
    base = _ssd_base(s, seed, device)
    base["dcb"] = _cb(s, base["g"], device) * 0.01
    base["residual"] = _randn(base["g"], base["B"].shape, torch.float32, device, 0.1)
    return base


def inputs_chunk_cumsum_bwd(s, seed, device):
    base = _ssd_base(s, seed, device)
    g = base["g"]
    base["ddA"] = _randn(g, base["dt"].shape, torch.float32, device, 0.1)
    base["ddt_out"] = _randn(g, base["dt"].shape, torch.float32, device, 0.1)
    base["dt_softplus"] = True
    return base


def inputs_chunk_cumsum_bwd_terms(s, seed, device):
    """The last backward stage's ddA terms as partials, counted as at nemotron3-nano's configs: 6 dCB slots
    (32 x 64 tiles of a 128 chunk), 2 dstate blocks each for dB and dC."""
    base = inputs_chunk_cumsum_bwd(s, seed, device)
    g, shape = base["g"], tuple(base["dt"].shape)
    base["intra_steps"] = _randn(g, (*shape, 6), torch.float32, device, 0.02)
    base["next_steps"] = _randn(g, (*shape, 2), torch.float32, device, 0.02)
    base["prev_parts"] = _randn(g, (*shape, 2), torch.float32, device, 0.05)
    base["chunk_grad"] = _randn(g, shape[:3], torch.float32, device, 0.1)
    return base


def packed_seq_idx(g: torch.Generator, batch: int, seqlen: int, docs: int, device: torch.device) -> torch.Tensor:
    """(batch, seqlen) int32: ``docs`` packed documents per row, at seeded boundaries (anywhere, not only on
    chunk edges), as a data loader that packs documents hands them to ``Mamba2``."""
    rows = []
    for _ in range(batch):
        cuts = torch.randperm(seqlen - 1, generator=g, device=device)[:docs - 1].sort().values + 1
        starts = torch.zeros(seqlen, dtype=torch.int32, device=device)
        starts[cuts] = 1
        rows.append(torch.cumsum(starts, 0, dtype=torch.int32))
    return torch.stack(rows).contiguous()


def inputs_call(s: ShapeSpec, seed: int, device: torch.device) -> Inputs:
    """The whole call's arguments in the shape's call pattern (``ShapeSpec.pattern``)."""
    base = _ssd_base(s, seed, device)
    g = base["g"]
    base["dt_raw"] = base["dt_raw"].to(s.dt_torch_dtype)
    base["dt_softplus"] = True
    if s.d_per_dim:
        base["D"] = _randn(g, (s.nheads, s.headdim), torch.float32, device)
    base["z_call"] = base["z"] if s.z else None
    base["initial_states"] = (_randn(g, (s.batch, s.nheads, s.headdim, s.dstate), torch.float32, device)
                              if s.initial_states else None)
    base["seq_idx"] = packed_seq_idx(g, s.batch, s.seqlen, s.docs, device) if s.docs > 1 else None
    return base


def inputs_norm(s: ShapeSpec, seed: int, device: torch.device) -> Inputs:
    g = _rng(seed, device)
    M, N, dtype = s.batch * s.seqlen, s.d_ssm, s.torch_dtype
    x = _randn(g, (M, N), dtype, device)
    z = _randn(g, (M, N), dtype, device)
    eps = 1e-5
    gated = x.float() * torch.nn.functional.silu(z.float()) if not s.norm_before_gate else x.float()
    grouped = gated.view(M, N // s.norm_group_size, s.norm_group_size)
    # rstd as the forward stores it: (ngroups * M,), group-major
    rstd = torch.rsqrt(grouped.square().mean(-1) + eps).t().contiguous().view(-1)
    return {
        "x": x, "z": z, "weight": _rand(g, (N,), dtype, device, 0.5, 1.5), "bias": None, "eps": eps,
        "dy": _randn(g, (M, N), dtype, device, 0.1), "rstd": rstd, "mean": None, "none": None,
        "group_size": s.norm_group_size, "norm_before_gate": s.norm_before_gate,
        "true": True, "false": False,
    }


def inputs_conv(s: ShapeSpec, seed: int, device: torch.device) -> Inputs:
    """x and dout channels last, (batch, dim, seqlen) views of (batch, seqlen, dim) memory: how Mamba2 calls
    the conv on xBC."""
    g = _rng(seed, device)
    dim, dtype = s.conv_dim, s.torch_dtype
    return {
        "x": _randn(g, (s.batch, s.seqlen, dim), dtype, device).transpose(1, 2),
        "weight": _randn(g, (dim, s.conv_width), dtype, device, 0.5),
        "bias": _randn(g, (dim,), dtype, device, 0.1),
        "dout": _randn(g, (s.batch, s.seqlen, dim), dtype, device, 0.1).transpose(1, 2),
        "seq_idx": None,
        "activation": "silu",
    }


def inputs_layer(s: ShapeSpec, seed: int, device: torch.device) -> Inputs:
    """What ``Mamba2`` hands ``mamba_split_conv1d_scan_combined``: the in_proj output (z, xBC, dt), the conv
    and norm weights, fp32 A, D and dt_bias; no out_proj (the layer's own kernels)."""
    g = _rng(seed, device)
    dtype, conv_dim = s.torch_dtype, s.conv_dim
    return {
        "zxbcdt": _randn(g, (s.batch, s.seqlen, s.d_ssm + conv_dim + s.nheads), dtype, device),
        "conv_weight": _randn(g, (conv_dim, s.conv_width), dtype, device, 0.5),
        "conv_bias": _randn(g, (conv_dim,), dtype, device, 0.1),
        "dt_bias": _rand(g, (s.nheads,), torch.float32, device, -4.0, -2.0),
        "A": -_rand(g, (s.nheads,), torch.float32, device, 1.0, 16.0),
        "D": _randn(g, (s.nheads, s.headdim) if s.d_per_dim else (s.nheads,), torch.float32, device),
        "norm_weight": _rand(g, (s.d_ssm,), dtype, device, 0.5, 1.5),
        "dout": _randn(g, (s.batch, s.seqlen, s.d_ssm), dtype, device, 0.1),
        "seq_idx": packed_seq_idx(g, s.batch, s.seqlen, s.docs, device) if s.docs > 1 else None,
        "chunk_size": s.chunk_size, "headdim": s.headdim, "ngroups": s.ngroups,
        "norm_before_gate": s.norm_before_gate, "eps": 1e-5,
    }
