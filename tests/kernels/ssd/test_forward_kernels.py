"""The Helion SSD forward kernels (kernels/ssd/{chunk_cumsum,chunk_state,state_passing,bmm_chunk,
chunk_scan,chunk_state_passing}.py) against the fp64 references of kernels/ssd/naive.py and against mamba-ssm.

CPU: Helion ref mode (the kernel bodies as PyTorch) at the smoke shape and odd shapes, plus seq_idx and
the optional arguments; Triton's interpreter with a temporary config file whose block sizes are smaller
than the dimensions (so tiling and masking run), and mamba-ssm in the interpreter at the smoke shape.
GPU (``-m gpu``): every suite shape, bf16, against mamba-ssm: |ours - mamba| <= 1e-2 + 1e-2 |mamba|.
"""

from __future__ import annotations

import pytest
import torch

from kernels import config_store, registry, suites
from kernels._runtime import TunedKernel, capture_launches, pinned_config, scaled_atol
from kernels.ssd import (
    _keys,
    bmm_chunk,
    chunk_cumsum,
    chunk_scan,
    chunk_state,
    chunk_state_passing,
    naive,
    state_passing,
)
from kernels.testing import execution_mode

KERNELS = ("chunk_cumsum", "chunk_state", "state_passing", "bmm_chunk", "chunk_scan", "chunk_state_passing",
           "chunk_state_passing_fp32")
SMOKE = suites.load().shape("smoke")  # b1 L96 h4 p16 g2 n16 Q32 fp32
ODD = {
    "smoke": {},
    "ragged": {"seqlen": 80},  # not a multiple of chunk_size
    "g1": {"ngroups": 1, "seqlen": 70},
    "g_eq_h": {"ngroups": 4},
    "p32": {"headdim": 32, "batch": 2, "seqlen": 50},
    "n32": {"dstate": 32},
}
# Small blocks for the interpreter: every one below the dimension it tiles at TILED (p32 n16 Q32 h4).
TILED = SMOKE.replace(headdim=32, seqlen=80, batch=2)
SMALL_BLOCKS = {
    "chunk_cumsum": [2],  # heads
    "chunk_state": [16, 16, 16],  # headdim, dstate, chunk
    "state_passing": [64],  # headdim * dstate = 512 (also with scan=True: state_passing_scan below)
    "bmm_chunk": [16, 16, 16],  # rows, columns (Q = 32), k
    "chunk_scan": [16, 16, 16, 16],  # rows, headdim, columns, dstate
    "chunk_state_passing": [16, 8],  # headdim, dstate (the chunk is one tile)
}


def _close(ours: dict, ref: dict, atol=1e-4, rtol=1e-4):
    assert set(ref) <= set(ours), (sorted(ours), sorted(ref))
    for name, expected in ref.items():
        got = ours[name].double()
        assert got.shape == expected.shape, name
        torch.testing.assert_close(got, expected.double(), atol=atol, rtol=rtol, msg=name)


def _dtypes_match(ours: dict, theirs: dict):
    for name, t in theirs.items():
        assert ours[name].dtype == t.dtype, (name, ours[name].dtype, t.dtype)


def _seq_idx(batch: int, seqlen: int) -> torch.Tensor:
    row = torch.zeros(seqlen, dtype=torch.int32)
    row[20:] = 1
    row[64:] = 2  # a boundary on a chunk border
    rows = [row, (torch.arange(seqlen) >= 50).to(torch.int32)]
    return torch.stack(rows[:batch]).contiguous()


# ---------------------------------------------------------------------------------------------------
# Ref mode: registry inputs at odd shapes, against the fp64 reference


@pytest.mark.parametrize("odd", list(ODD), ids=list(ODD))
@pytest.mark.parametrize("name", KERNELS)
def test_ref_mode_matches_fp64_reference(name, odd):
    entry = registry.get(name)
    inputs = entry.inputs(SMOKE.replace(**ODD[odd]), 0)
    with execution_mode("ref"):
        ours = entry.run_helion(inputs)
    _close(ours, entry.run_reference(inputs))


@pytest.mark.parametrize("variant", ["loop", "scan"])
def test_state_passing_variants_with_initial_states(variant):
    g = torch.Generator().manual_seed(3)
    states = torch.randn(2, 5, 4, 48, generator=g)
    dA = -torch.rand(2, 4, 5, generator=g) * 3
    init = torch.randn(2, 4, 48, generator=g)
    with execution_mode("ref"), pinned_config(state_passing.state_passing_kernel, {"scan": variant == "scan"}):
        out, final = state_passing.state_passing_fwd(states, dA, init, out_dtype=torch.float16)
    ref_out, ref_final = naive.state_passing_fwd(states.double(), dA.double(), init.double())
    assert out.dtype == torch.float16 and final.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(final.double(), ref_final, atol=1e-5, rtol=1e-5)


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
        seq = _seq_idx(shape.batch, shape.seqlen)
        inp["cb"] = naive.bmm_chunk_fwd(inp["C"], inp["B"], shape.chunk_size, seq_idx=seq, output_dtype=torch.float32)
    args = (inp["cb"], inp["x"], inp["dt"], inp["dA_cumsum"], inp["C"], inp["states"], D, z, seq)
    with execution_mode("ref"):
        out, out_x = chunk_scan.chunk_scan_fwd(*args)
    ref_out, ref_x = naive.chunk_scan_fwd(*(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point()
                                            else a for a in args))
    torch.testing.assert_close(out.double(), ref_out, atol=1e-4, rtol=1e-4)
    assert (out_x is None) == (z is None)
    if z is not None:
        torch.testing.assert_close(out_x.double(), ref_x, atol=1e-4, rtol=1e-4)


def test_seq_idx_chunk_state_state_passing_bmm():
    shape = SMOKE.replace(seqlen=90, batch=2)
    inp = registry.get("chunk_state").inputs(shape, 1)
    seq = _seq_idx(shape.batch, shape.seqlen)
    f64 = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inp.items()}
    with execution_mode("ref"):
        st = chunk_state.chunk_state_fwd(inp["B"], inp["x"], inp["dt"], inp["dA_cumsum"], seq_idx=seq)
        cb = bmm_chunk.bmm_chunk_fwd(inp["C"], inp["B"], shape.chunk_size, seq_idx=seq, causal=True)
        cb2 = bmm_chunk.bmm_chunk_fwd(inp["C"][:, :, 0], inp["B"][:, :, 0], shape.chunk_size, seq_idx=seq,
                                      output_dtype=torch.float64)
        passed, final = state_passing.state_passing_fwd(
            st.flatten(-2), inp["dA_cumsum"][..., -1], seq_idx=seq, chunk_size=shape.chunk_size)
    ref_st = naive.chunk_state_fwd(f64["B"], f64["x"], f64["dt"], f64["dA_cumsum"], seq_idx=seq)
    torch.testing.assert_close(st.double(), ref_st, atol=1e-4, rtol=1e-4)
    ref_cb = naive.bmm_chunk_fwd(f64["C"], f64["B"], shape.chunk_size, seq_idx=seq, causal=True)
    torch.testing.assert_close(cb.double(), ref_cb, atol=1e-4, rtol=1e-4)
    assert cb2.dtype == torch.float64 and cb2.dim() == 4
    ref_cb2 = naive.bmm_chunk_fwd(f64["C"][:, :, 0], f64["B"][:, :, 0], shape.chunk_size, seq_idx=seq)
    torch.testing.assert_close(cb2, ref_cb2, atol=1e-4, rtol=1e-4)
    ref_passed, ref_final = naive.state_passing_fwd(ref_st.flatten(-2), f64["dA_cumsum"][..., -1], seq_idx=seq,
                                                    chunk_size=shape.chunk_size)
    torch.testing.assert_close(passed.double(), ref_passed, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final.double(), ref_final, atol=1e-4, rtol=1e-4)


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
    seq = _seq_idx(2, 90)  # row 0: sequences from 20 and 64 (a chunk border); row 1: from 50
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
    inp = registry.get("chunk_state").inputs(shape, 4)
    seq = _seq_idx(shape.batch, shape.seqlen)
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


def _reset_dispatch():
    for module in (chunk_cumsum, chunk_state, state_passing, bmm_chunk, chunk_scan, chunk_state_passing):
        for value in vars(module).values():
            if isinstance(value, TunedKernel):
                value._dispatch.clear()


@pytest.fixture
def small_block_configs(tmp_path, monkeypatch):
    """A cpu.yaml holding SMALL_BLOCKS for every launch at TILED, and lookups pointed at it."""
    cf = config_store.ConfigFile(tuned={"note": "test: small blocks"})
    for name in KERNELS:
        entry = registry.get(name)
        inputs = entry.inputs(TILED, 0)
        with execution_mode("ref"), capture_launches() as launches:
            entry.run_helion(inputs)
        for tk, kargs in launches:
            cf.put(tk.name, tk.shape_key(*kargs), {"block_sizes": SMALL_BLOCKS[tk.name], "num_warps": 4})
    config_store.save(tmp_path / "cpu.yaml", cf)
    monkeypatch.setattr(config_store, "CONFIG_DIR", tmp_path)
    monkeypatch.setenv("MAMBA2_GUARD_GPU_SLUG", "cpu")
    _reset_dispatch()
    yield cf
    _reset_dispatch()


@pytest.mark.parametrize("name", [*KERNELS, "state_passing_scan"])
def test_interpreter_small_blocks(name, small_block_configs):
    entry = registry.get("state_passing" if name == "state_passing_scan" else name)
    inputs = entry.inputs(TILED, 0)
    fn = entry.helion_fn()
    if name == "state_passing_scan":
        def fn(*a):
            scan_config = {"block_sizes": SMALL_BLOCKS["state_passing"], "num_warps": 4, "scan": True}
            with pinned_config(state_passing.state_passing_kernel, scan_config):
                return state_passing.state_passing_fwd(*a)
    before = config_store.FALLBACKS.copy()
    with execution_mode("triton"):
        ours = entry._call(fn, inputs)
    assert before == config_store.FALLBACKS, "a launch missed its small-block config"
    _close(ours, entry.run_reference(inputs))


def test_interpreter_default_config_matches_mamba_ssm():
    _reset_dispatch()
    for name in KERNELS:
        entry = registry.get(name)
        inputs = entry.inputs(SMOKE, 0)
        with execution_mode("triton"):
            ours = entry.run_helion(inputs)
            theirs = entry.run_baseline(inputs)
        _dtypes_match(ours, theirs)
        _close(ours, {k: v.double() for k, v in theirs.items()}, atol=1e-4, rtol=1e-4)
    _reset_dispatch()


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
    entry = registry.get(name)
    shape = suites.load().shape(shape_name)
    inputs = entry.inputs(shape, 0, "cuda")
    ours = entry.run_helion(inputs)
    theirs = entry.run_baseline(inputs)
    _dtypes_match(ours, theirs)
    for key, ref in theirs.items():
        atol, rtol = entry.tolerance(key)
        err = (ours[key].float() - ref.float()).abs()
        bound = scaled_atol(ref, atol) + rtol * ref.float().abs()  # the bench's criterion
        assert bool((err <= bound).all()), (key, err.max().item())
