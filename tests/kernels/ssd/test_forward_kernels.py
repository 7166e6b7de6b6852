"""The Helion SSD forward kernels (mamba2_kernels/ssd/{chunk_cumsum,bmm_chunk,chunk_scan,chunk_state_passing,
ssd_fused_fwd}.py)
against the fp64 references of mamba2_kernels/ssd/naive.py and against mamba-ssm (the parity kernels: parity/).

CPU: Helion ref mode (the kernel bodies as PyTorch) at the smoke shape and odd shapes, plus seq_idx and
the optional arguments; Triton's interpreter with a temporary config file whose block sizes are smaller
than the dimensions (so tiling and masking run), and mamba-ssm in the interpreter at the smoke shape.
GPU (``-m gpu``): every suite shape, bf16, against mamba-ssm: |ours - mamba| <= 1e-2 + 1e-2 |mamba|.
"""

from __future__ import annotations

import pytest
import torch

from mamba2_kernels import registry, suites
from mamba2_kernels._runtime import pinned_config
from mamba2_kernels.ssd import _keys, bmm_chunk, chunk_cumsum, chunk_scan, chunk_state_passing, naive, ssd_fused_fwd
from mamba2_kernels.testing import execution_mode

from . import checks
from .checks import (
    SMOKE,
    assert_gpu_matches_mamba_ssm,
    assert_interpreter_matches_mamba_ssm,
    assert_interpreter_matches_reference,
    assert_ref_mode_matches_reference,
    entries_of,
    seq_idx_rows,
    small_block_configs,
)

MODULES = (chunk_cumsum, bmm_chunk, chunk_scan, chunk_state_passing, ssd_fused_fwd)
KERNELS = entries_of(MODULES)
ODD = {**checks.ODD, "n32": {"dstate": 32}}
# Small blocks for the interpreter: every one below the dimension it tiles at TILED (p32 n16 Q32 h4).
SMALL_BLOCKS = {
    "chunk_cumsum": [2],  # heads
    "bmm_chunk": [16, 16, 16],  # rows, columns (Q = 32), k
    "chunk_scan": [16, 16, 16, 16],  # rows, headdim, columns, dstate
    "chunk_state_passing": [16, 8],  # headdim, dstate (the chunk is one tile)
    "ssd_fused_fwd": [16, 16, 16, 16],  # headdim, the state product's chunk block, rows, columns
}


# ---------------------------------------------------------------------------------------------------
# Ref mode: registry inputs at odd shapes, against the fp64 reference


@pytest.mark.parametrize("odd", list(ODD), ids=list(ODD))
@pytest.mark.parametrize("name", KERNELS)
def test_ref_mode_matches_fp64_reference(name, odd):
    assert_ref_mode_matches_reference(name, SMOKE.replace(**ODD[odd]))


def _scan_inputs(shape, seed=0):
    inputs = registry.get("chunk_scan").inputs(shape, seed)
    return inputs


@pytest.mark.parametrize("options", ["D_hp_z", "no_D", "seq_idx"])
def test_chunk_scan_options(options):
    shape = SMOKE.replace(seqlen=80, batch=2)
    inp = _scan_inputs(shape)
    g = torch.Generator().manual_seed(5)
    D, z, seq = inp["D"], None, None
    if options == "D_hp_z":
        D = torch.randn(shape.nheads, shape.headdim, generator=g)
        z = torch.randn(inp["x"].shape, generator=g)
    elif options == "no_D":
        D = None
    else:
        seq = seq_idx_rows(shape.batch, shape.seqlen)
        inp["cb"] = naive.bmm_chunk_fwd(inp["C"], inp["B"], shape.chunk_size, seq_idx=seq, output_dtype=torch.float32)
    args = (inp["cb"], inp["x"], inp["dt"], inp["dA_cumsum"], inp["C"], inp["states"], D, z, seq)
    with execution_mode("ref"):
        ours = chunk_scan.chunk_scan_fwd(*args)
    _assert_scan_matches_fp64(ours, naive.chunk_scan_fwd, args)


def _assert_scan_matches_fp64(ours, reference, args) -> None:
    """(out, out_x) against ``reference`` on ``args`` in fp64; out_x only where z was given."""
    ref_out, ref_x = reference(*(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                                 for a in args))
    torch.testing.assert_close(ours[0].double(), ref_out, atol=1e-4, rtol=1e-4)
    assert (ours[1] is None) == (ref_x is None)
    if ref_x is not None:
        torch.testing.assert_close(ours[1].double(), ref_x, atol=1e-4, rtol=1e-4)


def test_seq_idx_bmm():
    shape = SMOKE.replace(seqlen=90, batch=2)
    inp = registry.get("bmm_chunk").inputs(shape, 1)
    seq = seq_idx_rows(shape.batch, shape.seqlen)
    f64 = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inp.items()}
    with execution_mode("ref"):
        cb = bmm_chunk.bmm_chunk_fwd(inp["C"], inp["B"], shape.chunk_size, seq_idx=seq, causal=True)
        cb2 = bmm_chunk.bmm_chunk_fwd(inp["C"][:, :, 0], inp["B"][:, :, 0], shape.chunk_size, seq_idx=seq,
                                      output_dtype=torch.float64)
    ref_cb = naive.bmm_chunk_fwd(f64["C"], f64["B"], shape.chunk_size, seq_idx=seq, causal=True)
    torch.testing.assert_close(cb.double(), ref_cb, atol=1e-4, rtol=1e-4)
    assert cb2.dtype == torch.float64 and cb2.dim() == 4
    ref_cb2 = naive.bmm_chunk_fwd(f64["C"][:, :, 0], f64["B"][:, :, 0], shape.chunk_size, seq_idx=seq)
    torch.testing.assert_close(cb2, ref_cb2, atol=1e-4, rtol=1e-4)


def test_by_chunk_views_whole_chunks_and_pads_a_ragged_tail():
    t = torch.arange(2 * 96 * 3, dtype=torch.float32).view(2, 96, 3)
    whole = _keys.by_chunk(t, 32)
    assert whole.shape == (2, 3, 32, 3) and whole.data_ptr() == t.data_ptr()  # a view, no copy
    ragged = _keys.by_chunk(t[:, :80], 32)
    assert ragged.shape == (2, 3, 32, 3)
    torch.testing.assert_close(ragged.reshape(2, 96, 3)[:, :80], t[:, :80])
    assert not ragged.reshape(2, 96, 3)[:, 80:].any()


def test_carry_decay_log_drops_the_carry_only_across_sequences():
    dA = -torch.rand(2, 4, 3)
    assert torch.equal(_keys.carry_decay_log(dA, None, 32), dA)
    seq = seq_idx_rows(2, 90)  # row 0: sequences from 20 and 64 (a chunk border); row 1: from 50
    got = _keys.carry_decay_log(dA, seq, 32)
    dropped = torch.tensor([[True, False, True], [False, True, False]])  # chunk c's last vs the position before
    assert torch.equal(torch.isinf(got), dropped[:, None, :].expand_as(got))
    torch.testing.assert_close(got[~torch.isinf(got)], dA[~dropped[:, None, :].expand_as(dA)])


@pytest.mark.parametrize("mode", ["ref", "triton"])
def test_chunk_state_passing_seq_idx_initial_states(mode):
    """The fused pass against mamba-ssm's two stages chained (fp64 references): initial states carried in,
    sequences that start inside a chunk and on a chunk border, a ragged last chunk, a low-precision output;
    the interpreter with blocks below every dimension."""
    shape = SMOKE.replace(seqlen=90, batch=2, headdim=32)
    inp = registry.get("chunk_state_passing").inputs(shape, 4)
    seq = seq_idx_rows(shape.batch, shape.seqlen)
    init = torch.randn(shape.batch, shape.nheads, shape.headdim, shape.dstate,
                       generator=torch.Generator().manual_seed(2))
    args = (inp["B"], inp["x"], inp["dt"], inp["dA_cumsum"], init, seq)
    config = {"block_sizes": SMALL_BLOCKS["chunk_state_passing"], "num_warps": 4}
    with execution_mode(mode), pinned_config(chunk_state_passing.chunk_state_passing_kernel, config):
        out, final = chunk_state_passing.chunk_state_passing_fwd(*args, out_dtype=torch.float16)
    ref_out, ref_final = naive.chunk_state_passing_fwd(*(a.double() if a.is_floating_point() else a for a in args))
    assert out.dtype == torch.float16 and final.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(final.double(), ref_final, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("mode", "options"), [("ref", set()), ("ref", {"bias", "limit", "init"}),
                                                ("triton", {"bias", "limit", "init", "seq_idx"})],
                         ids=["ref-plain", "ref-bias-limit-init", "triton-all"])
def test_state_pass_that_makes_dt_itself_gives_the_chain_of_cumsum_and_state_pass(mode, options):
    """The call's raw dt in, dt_out and dA_cumsum made in the pass (bias, softplus, limits, 0 past a ragged
    last chunk) against chunk_cumsum then the state pass (fp64 references): both of those and the states, with
    sequences that start inside a chunk and on its border; the interpreter with blocks below every dimension."""
    shape = SMOKE.replace(seqlen=90, batch=2, headdim=32)
    inp = registry.get("chunk_cumsum_state_passing").inputs(shape, 8)
    g = torch.Generator().manual_seed(9)
    kwargs = {"dt_softplus": True, "dt_bias": inp["dt_bias"] + 3.0 if "bias" in options else None,
              "dt_limit": (0.03, 0.6) if "limit" in options else (0.0, float("inf")),
              "initial_states": torch.randn(shape.batch, shape.nheads, shape.headdim, shape.dstate, generator=g)
              if "init" in options else None,
              "seq_idx": seq_idx_rows(shape.batch, shape.seqlen) if "seq_idx" in options else None}
    args = (inp["dt_raw"], inp["A"], inp["B"], inp["x"], shape.chunk_size)
    config = {"block_sizes": SMALL_BLOCKS["chunk_state_passing"], "num_warps": 4}
    with execution_mode(mode), pinned_config(chunk_state_passing.chunk_state_passing_kernel, config):
        ours = chunk_state_passing.chunk_cumsum_state_passing_fwd(*args, out_dtype=torch.float16, **kwargs)
    ref = naive.chunk_cumsum_state_passing_fwd(*(a.double() if torch.is_tensor(a) else a for a in args),
                                               **{k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                                                  for k, v in kwargs.items()})
    assert [t.dtype for t in ours] == [torch.float32, torch.float32, torch.float16, torch.float32]
    for name, got, want, tol in zip(("dA_cumsum", "dt_out", "states", "final_states"), ours, ref,
                                    (1e-5, 1e-6, 2e-3, 1e-5), strict=True):
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol, msg=name)


@pytest.mark.parametrize(("mode", "options"), [("ref", {"seq_idx"}), ("ref", {"D_hp", "z"}),
                                                ("triton", {"seq_idx", "D_hp", "z"})],
                         ids=["ref-seq_idx", "ref-D_hp-z", "triton-all"])
def test_chunk_scan_that_makes_cb_itself_gives_the_chain_of_bmm_and_scan(mode, options):
    """cb None and B given: the kernel's own C B^T tiles (zero across sequences) against bmm_chunk then
    chunk_scan (fp64 references), at a ragged last chunk; the interpreter with blocks below every dimension."""
    shape = SMOKE.replace(seqlen=90, batch=2, headdim=32)
    inp = _scan_inputs(shape, 3)
    g = torch.Generator().manual_seed(6)
    D, z, seq = inp["D"], None, None
    if "seq_idx" in options:
        seq = seq_idx_rows(shape.batch, shape.seqlen)
    if "D_hp" in options:
        D = torch.randn(shape.nheads, shape.headdim, generator=g)
    if "z" in options:
        z = torch.randn(inp["x"].shape, generator=g)
    B = torch.randn(inp["C"].shape, generator=g)
    args = (inp["x"], inp["dt"], inp["dA_cumsum"], B, inp["C"], inp["states"], D, z, seq)
    config = {"block_sizes": SMALL_BLOCKS["chunk_scan"], "num_warps": 4}
    with execution_mode(mode), pinned_config(chunk_scan.chunk_scan_kernel, config):
        ours = chunk_scan.chunk_scan_fwd(None, *args[:3], *args[4:6], D=D, z=z, seq_idx=seq, B=B)
    _assert_scan_matches_fp64(ours, naive.bmm_chunk_scan_fwd, args)


def _fused_fwd_call(shape, options, seed=4):
    """The fused forward's arguments at ``shape`` with ``options`` of D_hp, z, init, seq_idx: chunk_cumsum's dt_out
    and dA_cumsum as its registry inputs give them."""
    inp = registry.get("ssd_fused_fwd").inputs(shape, seed)
    g = torch.Generator().manual_seed(seed + 1)
    kwargs = {"D": torch.randn(shape.nheads, shape.headdim, generator=g) if "D_hp" in options else inp["D"],
              "z": torch.randn(inp["x"].shape, generator=g) if "z" in options else None,
              "initial_states": torch.randn(shape.batch, shape.nheads, shape.headdim, shape.dstate, generator=g)
              if "init" in options else None,
              "seq_idx": seq_idx_rows(shape.batch, shape.seqlen) if "seq_idx" in options else None}
    return (inp["x"], inp["dt"], inp["dA_cumsum"], inp["B"], inp["C"]), kwargs


@pytest.mark.parametrize(("mode", "options"), [("ref", set()), ("ref", {"D_hp", "z", "init"}), ("ref", {"seq_idx"}),
                                                ("triton", {"D_hp", "z", "init", "seq_idx"})],
                         ids=["ref-plain", "ref-D_hp-z-init", "ref-seq_idx", "triton-all"])
def test_fused_forward_gives_the_chain_of_its_four_stages(mode, options):
    """The forward after chunk_cumsum in one launch against the state pass, bmm_chunk and chunk_scan (fp64
    references), at a ragged last chunk and a head dimension no block divides, with sequences that start inside a
    chunk and on its border; blocks below every dimension, so that each program walks several chunks and loops
    over rows, columns and the state product's blocks within each."""
    shape = SMOKE.replace(seqlen=90, batch=2, headdim=24)
    args, kwargs = _fused_fwd_call(shape, options)
    config = {"block_sizes": SMALL_BLOCKS["ssd_fused_fwd"], "num_warps": 4}
    with execution_mode(mode), pinned_config(ssd_fused_fwd.ssd_fused_fwd_kernel, config):
        out, out_x, final_states = ssd_fused_fwd.ssd_fused_fwd(*args, **kwargs)
    wide = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kwargs.items()}
    ref_out, ref_out_x, ref_final = naive.chunk_state_passing_scan_fwd(*(a.double() for a in args), **wide)
    assert out.dtype == args[0].dtype and final_states.dtype == torch.float32
    assert (out_x is None) == ("z" not in options)
    for name, got, want in (("out", out, ref_out), ("out_x", out_x, ref_out_x), ("final_states", final_states,
                                                                                    ref_final)):
        if want is not None:
            torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-4, msg=name)


def test_chunk_scan_without_cb_names_the_b_it_needs():
    inp = _scan_inputs(SMOKE)
    with pytest.raises(ValueError, match="B: expected a tensor of C's shape"):
        chunk_scan.chunk_scan_fwd(None, inp["x"], inp["dt"], inp["dA_cumsum"], inp["C"], inp["states"])


@pytest.mark.parametrize(("bias", "softplus", "limit"), [(False, False, (0.0, float("inf"))),
                                                           (True, True, (0.01, 0.05))])
def test_chunk_cumsum_options(bias, softplus, limit):
    inp = registry.get("chunk_cumsum").inputs(SMOKE.replace(seqlen=80), 2)
    args = (inp["dt_raw"], inp["A"], SMOKE.chunk_size, inp["dt_bias"] if bias else None, softplus, limit)
    with execution_mode("ref"):
        ours = chunk_cumsum.chunk_cumsum_fwd(*args)
    ref = naive.chunk_cumsum_fwd(args[0].double(), args[1].double(), args[2],
                                 None if args[3] is None else args[3].double(), softplus, limit)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------
# Triton interpreter: small blocks from a temporary config file, and mamba-ssm in the interpreter


@pytest.fixture
def small_blocks(tmp_path):
    """Every launch at TILED on SMALL_BLOCKS, from a temporary config file."""
    runs = {name: (registry.get(name), registry.get(name).helion_fn()) for name in KERNELS}
    configs = {name: {"block_sizes": blocks} for name, blocks in SMALL_BLOCKS.items()}
    with small_block_configs(tmp_path, runs, configs, MODULES) as cf:
        yield cf


@pytest.mark.parametrize("name", KERNELS)
def test_interpreter_small_blocks(name, small_blocks):
    entry = registry.get(name)
    assert_interpreter_matches_reference(entry, entry.helion_fn())


def test_interpreter_default_config_matches_mamba_ssm():
    assert_interpreter_matches_mamba_ssm(KERNELS, MODULES)


def test_non_power_of_two_chunk_scan_refuses():
    shape = SMOKE.replace(chunk_size=24, seqlen=48)
    inp = _scan_inputs(shape)
    with pytest.raises(NotImplementedError, match="chunk_size"):
        chunk_scan.chunk_scan_fwd(inp["cb"], inp["x"], inp["dt"], inp["dA_cumsum"], inp["C"], inp["states"])


# ---------------------------------------------------------------------------------------------------
# GPU: every suite shape, bf16, against mamba-ssm


@pytest.mark.gpu
@pytest.mark.parametrize("shape_name", suites.load().suites["default"])
@pytest.mark.parametrize("name", KERNELS)
def test_gpu_matches_mamba_ssm(name, shape_name):
    assert_gpu_matches_mamba_ssm(name, shape_name)
