"""The one place a kernel is declared.

Every kernel of the Mamba-2 layer has one ``KernelEntry``: its stable name, the mamba-ssm kernel it
replaces and its phase label (the launch order of ``../shared/notes/mamba_ssm.md`` section 2), a seeded
input factory, the argument order shared by all three implementations (mamba-ssm's wrapper, the
pure-PyTorch reference and the Helion kernel take the same arguments and return the same tuple), a
bytes-moved and FLOPs model for roofline fractions, and per-output tolerances.

``helion`` is None until the Helion implementation exists; tools then report the kernel as missing,
never as passing and never by running mamba-ssm in its place.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mamba2_kernels import _mamba_ssm
from mamba2_kernels._targets import load_target
from mamba2_kernels.suites import ShapeSpec

Inputs = dict[str, Any]
Outputs = dict[str, torch.Tensor]
FAMILIES = ("ssd", "norm", "conv", "layer")
DEFAULT_TOLERANCE = (1e-2, 1e-2)  # (atol, rtol)
# Phases of whole calls (many kernels each): timed as users make the call, never summed with kernels.
COMPOSITE_PHASES = ("call_", "layer_")
INF = float("inf")


class MissingImplementation(LookupError):
    """The entry has no implementation of the requested kind (yet)."""


class BaselineUnavailable(LookupError):
    """The comparison implementation (mamba-ssm or causal-conv1d) cannot be loaded here."""


@dataclass(frozen=True)
class KernelEntry:
    name: str
    family: str
    phase: str
    replaces: str
    make_inputs: Callable[[ShapeSpec, int, torch.device], Inputs]
    args: tuple[str, ...]
    outputs: tuple[str, ...]
    reference: str
    baseline: str | None
    helion: str | None
    bytes_moved: Callable[[ShapeSpec], int]
    flops: Callable[[ShapeSpec], int]
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    # "mamba_ssm": ``baseline`` is a path inside mamba-ssm (loaded without its CUDA extension) or a "mamba2_kernels."
    # wrapper over such paths; otherwise ``baseline`` is a plain "module:function" of the package named here.
    baseline_name: str = "mamba_ssm"
    # A package the baseline needs at run time (causal-conv1d's CUDA kernels), absent on many installs.
    baseline_requires: str | None = None
    # A whole call through autograd: the outputs are the gradients of these inputs for upstream "dout".
    grad_of: tuple[str, ...] = ()
    # Outputs that concatenate quantities of different scales, judged part by part: inputs -> {output:
    # ((part, width along the last dim), ...)}; the parts replace the output as "output.part".
    output_parts: Callable[[Inputs], dict[str, tuple[tuple[str, int], ...]]] | None = None

    @property
    def has_helion(self) -> bool:
        return self.helion is not None

    def tolerance(self, output: str) -> tuple[float, float]:
        return self.tolerances.get(output, DEFAULT_TOLERANCE)

    def inputs(self, shape: ShapeSpec, seed: int, device: torch.device | str = "cpu") -> Inputs:
        return self.make_inputs(shape, seed, torch.device(device))

    def bind(self, fn: Callable[..., Any], inputs: Inputs) -> Callable[[], Any]:
        """``fn`` with this entry's arguments taken from ``inputs``: the call that gets timed.

        ``args`` items are input names passed by position, or ``"keyword=name"`` passed by keyword.
        With ``grad_of``, the call is a forward and a backward through autograd (``dout`` upstream)."""
        positional = tuple(inputs[a] for a in self.args if "=" not in a)
        keywords = {k: inputs[v] for k, v in (a.split("=", 1) for a in self.args if "=" in a)}
        if not self.grad_of:
            return lambda: fn(*positional, **keywords)
        leaves = {name: inputs[name].detach().requires_grad_(True) for name in self.grad_of}
        by_position = [name for name in self.args if "=" not in name]
        positional = tuple(leaves.get(name, value) for name, value in zip(by_position, positional, strict=True))
        keywords = {k: leaves.get(self._input_for(k), v) for k, v in keywords.items()}
        wanted, dout = tuple(leaves.values()), inputs["dout"]

        def forward_backward():
            with torch.enable_grad():
                out = fn(*positional, **keywords)
                return torch.autograd.grad(out, wanted, dout)

        return forward_backward

    def _input_for(self, keyword: str) -> str:
        return next(a.split("=", 1)[1] for a in self.args if a.startswith(f"{keyword}="))

    def _call(self, fn: Callable[..., Any], inputs: Inputs) -> Outputs:
        result = self.bind(fn, inputs)()
        if not isinstance(result, (tuple, list)):
            result = (result,)
        if len(result) < len(self.outputs):
            raise ValueError(f"{self.name}: expected outputs {self.outputs}, got {len(result)} values")
        outputs = {name: value for name, value in zip(self.outputs, result, strict=False) if value is not None}
        return self._split_parts(outputs, inputs)

    def _split_parts(self, outputs: Outputs, inputs: Inputs) -> Outputs:
        if self.output_parts is None:
            return outputs
        for name, parts in self.output_parts(inputs).items():
            whole = outputs.pop(name)
            pieces = whole.split([width for _, width in parts], dim=-1)
            outputs.update({f"{name}.{part}": piece for (part, _), piece in zip(parts, pieces, strict=True)})
        return outputs

    def helion_fn(self) -> Callable[..., Any]:
        if self.helion is None:
            raise MissingImplementation(f"{self.name}: no Helion implementation yet")
        return load_target(self.helion)

    def baseline_fn(self) -> Callable[..., Any]:
        if self.baseline is None:
            raise BaselineUnavailable(f"{self.name}: mamba-ssm has no counterpart")
        try:
            if self.baseline_requires:
                importlib.import_module(self.baseline_requires)
            if self.baseline_name == "mamba_ssm" and not self.baseline.startswith("mamba2_kernels."):
                return _mamba_ssm.resolve(self.baseline)
            return load_target(self.baseline)
        except ImportError as exc:
            needs = self.baseline_requires or self.baseline_name
            raise BaselineUnavailable(f"{self.name}: the baseline needs {needs}, unavailable here: {exc}") from exc

    def run_helion(self, inputs: Inputs) -> Outputs:
        return self._call(self.helion_fn(), inputs)

    def run_baseline(self, inputs: Inputs) -> Outputs:
        return self._call(self.baseline_fn(), inputs)

    def run_reference(self, inputs: Inputs, dtype: torch.dtype | None = torch.float64) -> Outputs:
        """The pure-PyTorch reference; floating inputs are first cast to ``dtype`` (None: as given)."""
        if dtype is not None:
            inputs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                      for k, v in inputs.items()}
        return self._call(load_target(self.reference), inputs)


# ---------------------------------------------------------------------------------------------------
# Seeded input factories. Values follow what the layer produces: softplus-range dt, negative A,
# dA cumulated within each chunk (so decays stay in (0, 1]), unit-scale activations.


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


def _varlen_bytes(s: ShapeSpec) -> int:
    """Each sequence reads its last chunk (x, B, dt, dA_cumsum) and one entering state, writes one state."""
    el, nseqs = _sizes(s)["el"], 2 + s.batch * s.seqlen // 256
    h, p, n, Q = s.nheads, s.headdim, s.dstate, s.chunk_size
    return nseqs * (Q * (h * p + s.ngroups * n) * el + 2 * Q * h * 4 + 2 * h * p * n * el)


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


# ---------------------------------------------------------------------------------------------------
# Bytes and FLOPs models: compulsory traffic (each input read once, each output written once) and the
# multiply-adds of the matmuls, in the layouts the kernels use.


def _sizes(s: ShapeSpec) -> dict[str, int]:
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


def _model(traffic: Callable[[dict[str, int]], int]) -> Callable[[ShapeSpec], int]:
    return lambda s: int(traffic(_sizes(s)))


def _flops(fn: Callable[..., int]) -> Callable[[ShapeSpec], int]:
    return lambda s: int(fn(s.batch, s.seqlen, s.nheads, s.headdim, s.ngroups, s.dstate, s.chunk_size, s.nchunks))


def _norm_bytes(tensors: int) -> Callable[[ShapeSpec], int]:
    return lambda s: tensors * s.batch * s.seqlen * s.d_ssm * _sizes(s)["el"]


def _conv_bytes(tensors: int) -> Callable[[ShapeSpec], int]:
    return lambda s: tensors * s.batch * s.conv_dim * s.seqlen * _sizes(s)["el"]


_SSD = "mamba2_kernels.ssd.naive"
_SCAN = _mamba_ssm.SSD_CHUNK_SCAN
_STATE = _mamba_ssm.SSD_CHUNK_STATE
_PASS = _mamba_ssm.SSD_STATE_PASSING
_BMM = _mamba_ssm.SSD_BMM


def _entry(name, family, phase, replaces, make_inputs, args, outputs, reference, baseline, bytes_moved,
           flops, helion=None, **extra) -> KernelEntry:
    return KernelEntry(name=name, family=family, phase=phase, replaces=replaces, make_inputs=make_inputs,
                       args=tuple(args), outputs=tuple(outputs), reference=reference, baseline=baseline,
                       helion=helion, bytes_moved=bytes_moved, flops=flops, **extra)


ENTRIES: tuple[KernelEntry, ...] = (
    # ---- SSD forward
    _entry("chunk_cumsum", "ssd", "fwd_1", "_chunk_cumsum_fwd_kernel", inputs_chunk_cumsum,
           ("dt_raw", "A", "chunk_size", "dt_bias", "dt_softplus", "dt_limit"), ("dA_cumsum", "dt"),
           f"{_SSD}:chunk_cumsum_fwd", f"{_STATE}:_chunk_cumsum_fwd",
           _model(lambda z: z["dt_raw"] + 2 * z["dt"]), _flops(lambda b, L, h, p, G, n, Q, c: 8 * b * L * h),
           helion="mamba2_kernels.ssd.chunk_cumsum:chunk_cumsum_fwd"),
    _entry("chunk_state", "ssd", "fwd_2", "_chunk_state_fwd_kernel", inputs_chunk_state,
           ("B", "x", "dt", "dA_cumsum", "seq_idx"), ("states",),
           f"{_SSD}:chunk_state_fwd", f"{_STATE}:_chunk_state_fwd",
           _model(lambda z: z["bc"] + z["x"] + 2 * z["dt"] + z["states32"]),
           _flops(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n),
           helion="mamba2_kernels.ssd.parity.chunk_state:chunk_state_fwd"),
    _entry("state_passing", "ssd", "fwd_3", "_state_passing_fwd_kernel", inputs_state_passing,
           ("states", "dA_chunk_cumsum", "none", "seq_idx", "chunk_size", "io_dtype"), ("states", "final_states"),
           f"{_SSD}:state_passing_fwd", f"{_PASS}:_state_passing_fwd",
           _model(lambda z: z["states32"] + z["states"] + z["final"]),
           _flops(lambda b, L, h, p, G, n, Q, c: 2 * b * c * h * p * n),
           helion="mamba2_kernels.ssd.parity.state_passing:state_passing_fwd"),
    _entry("bmm_chunk", "ssd", "fwd_4", "_bmm_chunk_fwd_kernel", inputs_bmm_chunk,
           ("C", "B", "chunk_size", "seq_idx", "false", "fp32"), ("cb",),
           f"{_SSD}:bmm_chunk_fwd", f"{_BMM}:_bmm_chunk_fwd",
           _model(lambda z: 2 * z["bc"] + z["cb"]), _flops(lambda b, L, h, p, G, n, Q, c: 2 * b * c * G * Q * Q * n),
           helion="mamba2_kernels.ssd.bmm_chunk:bmm_chunk_fwd"),
    _entry("chunk_scan", "ssd", "fwd_5", "_chunk_scan_fwd_kernel", inputs_chunk_scan,
           ("cb", "x", "dt", "dA_cumsum", "C", "states", "D", "none", "seq_idx"), ("out", "out_x"),
           f"{_SSD}:chunk_scan_fwd", f"{_SCAN}:_chunk_scan_fwd",
           _model(lambda z: z["cb"] + 2 * z["x"] + 2 * z["dt"] + z["bc"] + z["states"]),
           _flops(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p + 2 * b * L * h * p * n),
           helion="mamba2_kernels.ssd.chunk_scan:chunk_scan_fwd"),
    # chunk_state then state_passing in one pass (our forward's form), against mamba-ssm's two kernels.
    _entry("chunk_state_passing", "ssd", "fwd_2_3", "_chunk_state_fwd_kernel + _state_passing_fwd_kernel",
           inputs_chunk_state, ("B", "x", "dt", "dA_cumsum", "none", "seq_idx", "io_dtype"), ("states", "final_states"),
           f"{_SSD}:chunk_state_passing_fwd", "mamba2_kernels._mamba_ssm:chunk_state_passing_fwd",
           _model(lambda z: z["bc"] + z["x"] + 2 * z["dt"] + z["states"] + z["final"]),
           _flops(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n + 2 * b * c * h * p * n),
           helion="mamba2_kernels.ssd.chunk_state_passing:chunk_state_passing_fwd"),
    # The state at the end of each sequence of a packed input (return_varlen_states=True), after chunk_scan.
    _entry("chunk_state_varlen", "ssd", "fwd_6", "_chunk_state_varlen_kernel", inputs_chunk_state_varlen,
           ("B", "x", "dt", "dA_cumsum", "cu_seqlens", "chunk_states"), ("varlen_states",),
           f"{_SSD}:chunk_state_varlen", f"{_STATE}:chunk_state_varlen", _varlen_bytes,
           lambda s: 2 * (2 + s.batch * s.seqlen // 256) * s.chunk_size * s.nheads * s.headdim * s.dstate,
           helion="mamba2_kernels.ssd.chunk_state_varlen:chunk_state_varlen"),
    # ---- SSD backward (launch order of _mamba_chunk_scan_combined_bwd)
    # The backward's recompute of the states (fp32 output, as mamba-ssm's backward computes them): the same
    # kernel under its own shape key, so that the bench watches it and the tuner gives it a whole job.
    _entry("chunk_state_passing_fp32", "ssd", "bwd_2_3",
           "_chunk_state_fwd_kernel + _state_passing_fwd_kernel (backward recompute, fp32 out)", inputs_chunk_state,
           ("B", "x", "dt", "dA_cumsum", "none", "seq_idx"), ("states", "final_states"),
           f"{_SSD}:chunk_state_passing_fwd", "mamba2_kernels._mamba_ssm:chunk_state_passing_fwd",
           _model(lambda z: z["bc"] + z["x"] + 2 * z["dt"] + z["states32"] + z["final"]),
           _flops(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n + 2 * b * c * h * p * n),
           helion="mamba2_kernels.ssd.chunk_state_passing:chunk_state_passing_fwd"),
    _entry("chunk_scan_bwd_dz", "ssd", "bwd_5", "_chunk_scan_bwd_dz_kernel", inputs_chunk_scan_bwd_dz,
           ("x", "z", "out_x", "dout", "chunk_size", "false", "D_per_dim"), ("dz", "dout_x", "dD"),
           f"{_SSD}:chunk_scan_bwd_dz", f"{_SCAN}:_chunk_scan_bwd_dz",
           _model(lambda z: 6 * z["x"]), _flops(lambda b, L, h, p, G, n, Q, c: 12 * b * L * h * p),
           helion="mamba2_kernels.ssd.chunk_scan_bwd:chunk_scan_bwd_dz"),
    _entry("chunk_scan_bwd_dstates", "ssd", "bwd_6", "_chunk_scan_bwd_dstates_kernel", inputs_chunk_state,
           ("C", "dA_cumsum", "dout", "seq_idx", "fp32"), ("dstates",),
           f"{_SSD}:chunk_scan_bwd_dstates", f"{_SCAN}:_chunk_scan_bwd_dstates",
           _model(lambda z: z["bc"] + z["dt"] + z["x"] + z["states32"]),
           _flops(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n),
           helion="mamba2_kernels.ssd.parity.chunk_scan_bwd_dstates:chunk_scan_bwd_dstates"),
    _entry("state_passing_bwd", "ssd", "bwd_7", "_state_passing_bwd_kernel", inputs_state_passing_bwd,
           ("states", "dA_chunk_cumsum", "dstates_flat", "none", "seq_idx", "false", "io_dtype", "io_dtype",
            "chunk_size"), ("dstates", "ddA_chunk_cumsum", "dinitial_states", "states_converted"),
           f"{_SSD}:state_passing_bwd", f"{_PASS}:_state_passing_bwd",
           _model(lambda z: 2 * z["states32"] + 2 * z["states"]),
           _flops(lambda b, L, h, p, G, n, Q, c: 4 * b * c * h * p * n),
           helion="mamba2_kernels.ssd.parity.state_passing_bwd:state_passing_bwd"),
    # dstates then state passing backward in one pass (our backward's form), against mamba-ssm's two kernels.
    _entry("chunk_state_passing_bwd", "ssd", "bwd_6_7", "_chunk_scan_bwd_dstates_kernel + _state_passing_bwd_kernel",
           inputs_chunk_state_passing_bwd,
           ("C", "dA_cumsum", "dout", "states_fp32", "none", "seq_idx", "false", "io_dtype", "io_dtype"),
           ("dstates", "ddA_chunk_cumsum", "dinitial_states", "states_converted"),
           f"{_SSD}:chunk_state_passing_bwd", "mamba2_kernels._mamba_ssm:chunk_state_passing_bwd",
           _model(lambda z: z["bc"] + z["dt"] + z["x"] + z["states32"] + 2 * z["states"]),
           _flops(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n + 4 * b * c * h * p * n),
           helion="mamba2_kernels.ssd.chunk_state_passing_bwd:chunk_state_passing_bwd"),
    _entry("chunk_scan_chunk_state_bwd_dx", "ssd", "bwd_8", "_chunk_scan_chunk_state_bwd_dx_kernel",
           inputs_bwd_with_states,
           ("x", "dt", "dA_cumsum", "B", "cb", "dout", "dstates", "D", "seq_idx"), ("dx", "ddt", "dD"),
           f"{_SSD}:chunk_scan_chunk_state_bwd_dx", f"{_mamba_ssm.SSD_COMBINED}:_chunk_scan_chunk_state_bwd_dx",
           _model(lambda z: 3 * z["x"] + 3 * z["dt"] + z["bc"] + z["cb"] + z["states"]),
           _flops(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p + 2 * b * L * h * p * n),
           helion="mamba2_kernels.ssd.chunk_scan_chunk_state_bwd:chunk_scan_chunk_state_bwd_dx"),
    _entry("chunk_state_bwd_db", "ssd", "bwd_9", "_chunk_state_bwd_db_kernel", inputs_bwd_with_states,
           ("x", "dt", "dA_cumsum", "dstates", "seq_idx", "B", "ngroups"), ("dB", "ddA_next"),
           f"{_SSD}:chunk_state_bwd_db", f"{_STATE}:_chunk_state_bwd_db",
           _model(lambda z: z["x"] + 3 * z["dt"] + z["states"] + z["bc"] + z["bc32"]),
           _flops(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n),
           helion="mamba2_kernels.ssd.chunk_state_bwd:chunk_state_bwd_db"),
    _entry("chunk_scan_bwd_dC", "ssd", "bwd_10", "_chunk_scan_bwd_dc_kernel", inputs_bwd_with_states,
           ("prev_states", "dA_cumsum", "dout", "seq_idx", "C", "ngroups"), ("dC", "ddA_cumsum_prev"),
           f"{_SSD}:chunk_scan_bwd_dC", f"{_SCAN}:_chunk_scan_bwd_dC",
           _model(lambda z: z["states"] + 2 * z["dt"] + z["x"] + z["bc"] + z["bc32"]),
           _flops(lambda b, L, h, p, G, n, Q, c: 2 * b * L * h * p * n),
           helion="mamba2_kernels.ssd.chunk_scan_bwd:chunk_scan_bwd_dC"),
    _entry("chunk_scan_bwd_dcb", "ssd", "bwd_11", "_chunk_scan_bwd_dcb_kernel", inputs_bwd_with_states,
           ("x", "dt", "dA_cumsum", "dout", "seq_idx", "none", "ngroups"), ("dcb",),
           f"{_SSD}:chunk_scan_bwd_dcb", f"{_SCAN}:_chunk_scan_bwd_dcb",
           _model(lambda z: 2 * z["x"] + 2 * z["dt"] + z["cb"]),
           _flops(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p),
           helion="mamba2_kernels.ssd.chunk_scan_bwd:chunk_scan_bwd_dcb"),
    # dCB and the intra-chunk ddA in one pass (our backward's form), against mamba-ssm's backward, which runs
    # the dCB kernel, then the stable ddA kernel on the same products.
    _entry("chunk_scan_bwd_dcb_ddA", "ssd", "bwd_11_14",
           "_chunk_scan_bwd_dcb_kernel + _chunk_scan_bwd_ddAcs_stable_kernel", inputs_bwd_with_states,
           ("x", "dt", "dA_cumsum", "dout", "seq_idx", "cb", "ngroups"), ("dcb", "ddA"),
           f"{_SSD}:chunk_scan_bwd_dcb", "mamba2_kernels._mamba_ssm:dcb_and_intra_ddA",
           _model(lambda z: 2 * z["x"] + 2 * z["dt"] + 2 * z["cb"]),
           _flops(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p),
           helion="mamba2_kernels.ssd.chunk_scan_bwd:chunk_scan_bwd_dcb"),
    _entry("bmm_chunk_bwd", "ssd", "bwd_12", "_bmm_chunk_bwd_kernel", inputs_bmm_chunk_bwd,
           ("C", "dcb", "residual"), ("dB",),
           f"{_SSD}:bmm_chunk_bwd", f"{_BMM}:_bmm_chunk_bwd",
           _model(lambda z: z["bc"] + z["cb"] + 2 * z["bc32"]),
           _flops(lambda b, L, h, p, G, n, Q, c: 2 * b * c * G * Q * Q * n),
           helion="mamba2_kernels.ssd.bmm_chunk_bwd:bmm_chunk_bwd"),
    _entry("chunk_scan_bwd_ddAcs_stable", "ssd", "bwd_14", "_chunk_scan_bwd_ddAcs_stable_kernel",
           inputs_bwd_with_states, ("x", "dt", "dA_cumsum", "dout", "cb"), ("ddA_cumsum",),
           f"{_SSD}:chunk_scan_bwd_ddAcs_stable", f"{_SCAN}:_chunk_scan_bwd_ddAcs_stable",
           _model(lambda z: 2 * z["x"] + 3 * z["dt"] + z["cb"]),
           _flops(lambda b, L, h, p, G, n, Q, c: b * c * h * Q * Q * p),
           helion="mamba2_kernels.ssd.parity.chunk_scan_bwd_ddAcs_stable:chunk_scan_bwd_ddAcs_stable"),
    _entry("chunk_cumsum_bwd", "ssd", "bwd_15", "_chunk_cumsum_bwd_kernel", inputs_chunk_cumsum_bwd,
           ("ddA", "ddt_out", "dt_raw", "A", "dt_bias", "dt_softplus", "dt_limit"), ("ddt", "dA", "ddt_bias"),
           f"{_SSD}:chunk_cumsum_bwd", f"{_STATE}:_chunk_cumsum_bwd",
           _model(lambda z: 2 * z["dt_raw"] + 2 * z["dt"]), _flops(lambda b, L, h, p, G, n, Q, c: 10 * b * L * h),
           helion="mamba2_kernels.ssd.chunk_cumsum_bwd:chunk_cumsum_bwd"),
    # The same kernel building ddA from the three terms' partials (our backward's form), against those PyTorch
    # ops as our backward ran them before, then mamba-ssm's kernel.
    _entry("chunk_cumsum_bwd_terms", "ssd", "bwd_13_15", "_chunk_cumsum_bwd_kernel + the ddA terms' PyTorch ops",
           inputs_chunk_cumsum_bwd_terms,
           ("intra_steps", "next_steps", "prev_parts", "chunk_grad", "ddt_out", "dt_raw", "A", "dt_bias",
            "dt_softplus", "dt_limit"), ("ddt", "dA", "ddt_bias"),
           f"{_SSD}:chunk_cumsum_bwd_of_partial_terms", "mamba2_kernels._mamba_ssm:chunk_cumsum_bwd_of_terms",
           _model(lambda z: 2 * z["dt_raw"] + 12 * z["dt"]), _flops(lambda b, L, h, p, G, n, Q, c: 24 * b * L * h),
           helion="mamba2_kernels.ssd.chunk_cumsum_bwd:chunk_cumsum_bwd_of_terms"),
    # ---- gated RMSNorm (M = batch x seqlen rows of d_ssm, groups of norm_group_size)
    _entry("gated_rmsnorm_fwd", "norm", "norm_fwd", "_layer_norm_fwd_1pass_kernel", inputs_norm,
           ("x", "weight", "bias", "eps", "z", "none", "group_size", "norm_before_gate", "true"),
           ("out", "mean", "rstd"),
           "mamba2_kernels.norm.naive:gated_rmsnorm_fwd", f"{_mamba_ssm.LAYERNORM_GATED}:_layer_norm_fwd",
           _norm_bytes(3), lambda s: 8 * s.batch * s.seqlen * s.d_ssm,
           helion="mamba2_kernels.norm.gated_rmsnorm:gated_rmsnorm_fwd"),
    _entry("gated_rmsnorm_bwd", "norm", "norm_bwd", "_layer_norm_bwd_kernel", inputs_norm,
           ("dy", "x", "weight", "bias", "eps", "mean", "rstd", "z", "group_size", "norm_before_gate", "true"),
           ("dx", "dw", "db", "dz"),
           "mamba2_kernels.norm.naive:gated_rmsnorm_bwd", f"{_mamba_ssm.LAYERNORM_GATED}:_layer_norm_bwd",
           _norm_bytes(5), lambda s: 20 * s.batch * s.seqlen * s.d_ssm,
           helion="mamba2_kernels.norm.gated_rmsnorm:gated_rmsnorm_bwd"),
    # ---- causal depthwise conv1d over x, B and C (the causal-conv1d package is the CUDA baseline)
    _entry("causal_conv1d_fwd", "conv", "conv_fwd", "causal_conv1d_fwd (CUDA, causal-conv1d)", inputs_conv,
           # by keyword: causal_conv1d_fn's fifth parameter is initial_states
           ("x", "weight", "bias", "seq_idx=seq_idx", "activation=activation"), ("out",),
           "mamba2_kernels.conv.naive:causal_conv1d_fwd", "causal_conv1d:causal_conv1d_fn",
           _conv_bytes(2), lambda s: 2 * s.batch * s.conv_dim * s.seqlen * s.conv_width,
           baseline_name="causal_conv1d", baseline_requires="causal_conv1d",
           helion="mamba2_kernels.conv.causal_conv1d:causal_conv1d_fwd"),
    _entry("causal_conv1d_bwd", "conv", "conv_bwd", "causal_conv1d_bwd (CUDA, causal-conv1d)", inputs_conv,
           ("x", "weight", "bias", "dout", "seq_idx", "activation"), ("dx", "dweight", "dbias"),
           "mamba2_kernels.conv.naive:causal_conv1d_bwd", "mamba2_kernels.conv.naive:causal_conv1d_cuda_bwd",
           _conv_bytes(3), lambda s: 6 * s.batch * s.conv_dim * s.seqlen * s.conv_width,
           baseline_name="causal_conv1d", baseline_requires="causal_conv1d",
           helion="mamba2_kernels.conv.causal_conv1d:causal_conv1d_bwd"),
)


def _total(names: Sequence[str], model: str) -> Callable[[ShapeSpec], int]:
    return lambda s: sum(getattr(REGISTRY[n], model)(s) for n in names)


# The whole drop-in call, as a user makes it: x, dt, A, B, C, D and dt_bias with softplus, and z, initial states
# and seq_idx as the shape's call pattern says (by default none of them).
_CALL_ARGS = ("x", "dt_raw", "A", "B", "C", "chunk_size", "D=D", "z=z_call", "dt_bias=dt_bias",
              "initial_states=initial_states", "seq_idx=seq_idx", "dt_softplus=dt_softplus")
_FWD_STAGES = ("chunk_cumsum", "chunk_state_passing", "bmm_chunk", "chunk_scan")
# The entries whose kernels the whole call (forward + backward) launches, in launch order.
SSD_CALL_STAGES = (*_FWD_STAGES, "chunk_cumsum", "bmm_chunk", "chunk_state_passing_fp32",  # recomputed
                   "chunk_state_passing_bwd", "chunk_scan_chunk_state_bwd_dx",
                   "chunk_state_bwd_db", "chunk_scan_bwd_dC", "chunk_scan_bwd_dcb_ddA", "bmm_chunk_bwd",
                   "bmm_chunk_bwd", "chunk_cumsum_bwd_terms")
_COMBINED = f"{_mamba_ssm.SSD_COMBINED}:mamba_chunk_scan_combined"
CALLS: tuple[KernelEntry, ...] = (
    _entry("ssd_combined_fwd", "ssd", "call_fwd", "mamba_chunk_scan_combined (forward)", inputs_call,
           _CALL_ARGS, ("out",), f"{_SSD}:ssd_chunked_ref", _COMBINED,
           _total(_FWD_STAGES, "bytes_moved"), _total(_FWD_STAGES, "flops"),
           helion="mamba2_kernels.ssd.combined:mamba_chunk_scan_combined"),
    _entry("ssd_combined_fwd_bwd", "ssd", "call_fwd_bwd", "mamba_chunk_scan_combined (forward + backward)",
           inputs_call, _CALL_ARGS, ("dx", "ddt", "dA", "dB", "dC", "dD", "ddt_bias"),
           f"{_SSD}:ssd_chunked_ref", _COMBINED,
           _total(SSD_CALL_STAGES, "bytes_moved"), _total(SSD_CALL_STAGES, "flops"),
           helion="mamba2_kernels.ssd.combined:mamba_chunk_scan_combined",
           grad_of=("x", "dt_raw", "A", "B", "C", "D", "dt_bias")),
)
# The layer's own kernels (conv + SSD + gated norm), as Mamba2's memory-efficient path calls them.
_LAYER_ARGS = ("zxbcdt", "conv_weight", "conv_bias", "dt_bias", "A", "D", "chunk_size",
               "seq_idx=seq_idx", "rmsnorm_weight=norm_weight", "rmsnorm_eps=eps", "headdim=headdim",
               "ngroups=ngroups", "norm_before_gate=norm_before_gate")
_LAYER_FWD = ("causal_conv1d_fwd", *_FWD_STAGES, "gated_rmsnorm_fwd")
_LAYER_FWD_BWD = (*_LAYER_FWD, "causal_conv1d_bwd", *SSD_CALL_STAGES[len(_FWD_STAGES):], "gated_rmsnorm_bwd")
_SPLIT = f"{_mamba_ssm.SSD_COMBINED}:mamba_split_conv1d_scan_combined"
_LAYER_GRADS = ("dzxbcdt", "dconv_weight", "dconv_bias", "ddt_bias", "dA", "dD", "dnorm_weight")


def _zxbcdt_parts(inputs: Inputs) -> dict[str, tuple[tuple[str, int], ...]]:
    """The input gradient's slots (z, x, B, C, dt; no d_nonssm part in these inputs). Judged as one tensor,
    its rms-scaled atol came from the bulk (rms 0.11 at nemotron3-nano), far below the ddt slot's scale."""
    nheads, d_conv = inputs["A"].shape[0], inputs["conv_weight"].shape[0]
    d_ssm = nheads * inputs["headdim"]
    d_bc = (d_conv - d_ssm) // 2
    return {"dzxbcdt": (("dz", d_ssm), ("dx", d_ssm), ("dB", d_bc), ("dC", d_bc), ("ddt", nheads))}


LAYER: tuple[KernelEntry, ...] = (
    _entry("mamba2_layer_fwd", "layer", "layer_fwd", "mamba_split_conv1d_scan_combined (forward)", inputs_layer,
           _LAYER_ARGS, ("out",), "mamba2_kernels.layer_naive:mamba_split_conv1d_scan_ref", _SPLIT,
           _total(_LAYER_FWD, "bytes_moved"), _total(_LAYER_FWD, "flops"),
           helion="mamba2_kernels.layer_fn:mamba_split_conv1d_scan_combined", baseline_requires="causal_conv1d"),
    _entry("mamba2_layer_fwd_bwd", "layer", "layer_fwd_bwd", "mamba_split_conv1d_scan_combined (forward + backward)",
           inputs_layer, _LAYER_ARGS, _LAYER_GRADS, "mamba2_kernels.layer_naive:mamba_split_conv1d_scan_ref", _SPLIT,
           _total(_LAYER_FWD_BWD, "bytes_moved"), _total(_LAYER_FWD_BWD, "flops"),
           helion="mamba2_kernels.layer_fn:mamba_split_conv1d_scan_combined", baseline_requires="causal_conv1d",
           grad_of=("zxbcdt", "conv_weight", "conv_bias", "dt_bias", "A", "D", "norm_weight"),
           output_parts=_zxbcdt_parts),
)
ENTRIES = ENTRIES + CALLS + LAYER
REGISTRY: dict[str, KernelEntry] = {e.name: e for e in ENTRIES}


def seen_entries(fell_back: Iterable[str]) -> list[str]:
    """The entries that launch the keys training jobs fell back at (given the kernels that fell back), as the
    jobs called them: the whole SSD call, and the layer when a conv or norm kernel fell back (they run in the
    layer's call only). The per-stage entries' inputs are plain (no z, one document, no initial states), so
    at a call pattern they launch other keys."""
    layer = any(REGISTRY[name].family in ("conv", "norm") for name in fell_back if name in REGISTRY)
    return [entry.name for entry in (*CALLS, *(LAYER if layer else ()))]


def tuned_kernel_names() -> set[str]:
    """The names of every Helion kernel the entries launch: the names a config file's ``kernels:`` may use."""
    from mamba2_kernels._runtime import TUNED_KERNELS

    for entry in ENTRIES:
        if entry.has_helion:
            entry.helion_fn()  # imports the kernel's module, which defines its TunedKernels
    return set(TUNED_KERNELS)


def get(name: str) -> KernelEntry:
    if name not in REGISTRY:
        raise KeyError(f"unknown kernel {name!r}; valid kernels: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def select(names: Sequence[str] | None = None, family: str | None = None) -> list[KernelEntry]:
    """Entries by name (in the given order) or by family; all of them by default."""
    if family is not None and family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; valid families: {', '.join(FAMILIES)}")
    entries = [get(n) for n in names] if names else list(ENTRIES)
    return [e for e in entries if family is None or e.family == family]
