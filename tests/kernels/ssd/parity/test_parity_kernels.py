"""The parity kernels (mamba2_kernels/ssd/parity/: mamba-ssm's unfused kernels, four of them the state passes' chains)
against the fp64 references of mamba2_kernels/ssd/naive.py and against mamba-ssm.

CPU: Helion ref mode at the smoke shape and odd shapes, plus seq_idx, initial and final states and both
forms (loop, associative scan) of the state passing kernels; Triton's interpreter with a temporary config
file whose block sizes are smaller than the dimensions, and the forward kernels' default configs against
mamba-ssm in the interpreter at the smoke shape.
GPU (``-m gpu``): every suite shape, bf16, against mamba-ssm.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

import mamba2_kernels
from mamba2_kernels import registry, suites
from mamba2_kernels._runtime import pinned_config
from mamba2_kernels.ssd import naive
from mamba2_kernels.ssd.parity import chunk_scan_bwd_dstates, chunk_state, state_passing, state_passing_bwd
from mamba2_kernels.testing import execution_mode

from ..checks import (
    ODD,
    SMOKE,
    assert_gpu_matches_mamba_ssm,
    assert_interpreter_matches_mamba_ssm,
    assert_interpreter_matches_reference,
    assert_ref_mode_matches_reference,
    close,
    entries_of,
    f64,
    seq_idx_rows,
    small_block_configs,
)

MODULES = tuple(importlib.import_module(entry.helion.split(":")[0]) for entry in registry.ENTRIES
                if entry.helion and entry.helion.startswith("mamba2_kernels.ssd.parity."))
KERNELS = entries_of(MODULES)
# Block sizes (in register_block_size order) below every dimension they tile at TILED.
SMALL = {
    "chunk_state": {"block_sizes": [16, 16, 16]},  # headdim, dstate, chunk
    "state_passing": {"block_sizes": [64]},  # headdim * dstate = 512
    "chunk_scan_bwd_dstates": {"block_sizes": [16, 8, 16]},
    "state_passing_bwd": {"block_sizes": [64]},
    "chunk_scan_bwd_ddAcs_stable": {"block_sizes": [16, 8, 16]},
}
# The state passing kernels on their small blocks with the associative scan chosen.
SCAN = {"state_passing_scan": state_passing.state_passing_kernel,
        "state_passing_bwd_scan": state_passing_bwd.state_passing_bwd_kernel}


def test_every_parity_kernel_has_its_own_module_and_only_the_state_pass_chains_import_them():
    """The registry names them (by "module:function" strings); beyond it, only ``mamba2_kernels.ssd.fused_paths``
    imports the four kernels of the state passes' chains, so no user call reaches the others."""
    assert set(KERNELS) == set(SMALL) and len(MODULES) == len(KERNELS)
    parity = Path(MODULES[0].__file__).parent
    chains = {f"mamba2_kernels.ssd.parity.{name}" for name in
              ("chunk_state", "state_passing", "chunk_scan_bwd_dstates", "state_passing_bwd")}
    for source in Path(mamba2_kernels.__file__).parent.rglob("*.py"):
        if parity not in source.parents:
            allowed = chains if source.name == "fused_paths.py" else set()
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [getattr(node, "module", None) or "", *(alias.name for alias in node.names)]
                    assert not any("parity" in name and name not in allowed for name in names), source


@pytest.mark.parametrize("odd", list(ODD), ids=list(ODD))
@pytest.mark.parametrize("name", KERNELS)
def test_ref_mode_matches_fp64_reference(name, odd):
    assert_ref_mode_matches_reference(name, SMOKE.replace(**ODD[odd]))


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


@pytest.mark.parametrize("variant", ["loop", "scan"])
@pytest.mark.parametrize("case", ["plain", "init_final_convert", "seq_idx"])
def test_state_passing_bwd_options(variant, case):
    g = torch.Generator().manual_seed(4)
    batch, nchunks, nheads, dim = 2, 5, 3, 48
    states = torch.randn(batch, nchunks, nheads, dim, generator=g)
    dA = -torch.rand(batch, nheads, nchunks, generator=g) * 3
    dout = torch.randn(batch, nchunks, nheads, dim, generator=g)
    ref_kwargs = {}
    if case == "init_final_convert":
        ref_kwargs = {"dfinal_states": torch.randn(batch, nheads, dim, generator=g), "has_initial_states": True,
                      "dstates_dtype": torch.float16, "states_dtype": torch.float16}
    elif case == "seq_idx":
        ref_kwargs = {"seq_idx": seq_idx_rows(batch, 150), "chunk_size": 32, "states_dtype": torch.float32}
    with execution_mode("ref"), pinned_config(state_passing_bwd.state_passing_bwd_kernel, {"scan": variant == "scan"}):
        ours = state_passing_bwd.state_passing_bwd(states, dA, dout, **ref_kwargs)
    ref = naive.state_passing_bwd(states.double(), dA.double(), dout.double(),
                                  **{k: f64(v) for k, v in ref_kwargs.items()})
    tol = 2e-3 if case == "init_final_convert" else 1e-5
    close(ours, ref, tol, tol, "state_passing_bwd")
    if case == "init_final_convert":
        assert ours[0].dtype == ours[2].dtype == ours[3].dtype == torch.float16


def test_seq_idx_chunk_state_state_passing_dstates():
    shape = SMOKE.replace(seqlen=90, batch=2)
    inp = registry.get("chunk_state").inputs(shape, 1)
    seq = seq_idx_rows(shape.batch, shape.seqlen)
    ref = {k: f64(v) for k, v in inp.items()}
    with execution_mode("ref"):
        st = chunk_state.chunk_state_fwd(inp["B"], inp["x"], inp["dt"], inp["dA_cumsum"], seq_idx=seq)
        passed, final = state_passing.state_passing_fwd(
            st.flatten(-2), inp["dA_cumsum"][..., -1], seq_idx=seq, chunk_size=shape.chunk_size)
        dstates = chunk_scan_bwd_dstates.chunk_scan_bwd_dstates(inp["C"], inp["dA_cumsum"], inp["dout"], seq_idx=seq,
                                                                dtype=torch.float32)
    ref_st = naive.chunk_state_fwd(ref["B"], ref["x"], ref["dt"], ref["dA_cumsum"], seq_idx=seq)
    ref_passed, ref_final = naive.state_passing_fwd(ref_st.flatten(-2), ref["dA_cumsum"][..., -1], seq_idx=seq,
                                                    chunk_size=shape.chunk_size)
    ref_dstates = naive.chunk_scan_bwd_dstates(ref["C"], ref["dA_cumsum"], ref["dout"], seq_idx=seq,
                                               dtype=torch.float64)
    close((st, passed, final, dstates), (ref_st, ref_passed, ref_final, ref_dstates), label="seq_idx")


# ---------------------------------------------------------------------------------------------------
# Triton interpreter: small blocks from a temporary config file, and mamba-ssm in the interpreter


def _runs(name):
    """The entry and the function to run: ``*_scan`` is the state passing kernel with the scan chosen."""
    entry = registry.get(name.removesuffix("_scan"))
    fn = entry.helion_fn()
    if name in SCAN:
        def scanned(*a):
            with pinned_config(SCAN[name], {**SMALL[entry.name], "scan": True, "num_warps": 4}):
                return fn(*a)
        return entry, scanned
    return entry, fn


@pytest.fixture(scope="module")
def small_blocks(tmp_path_factory):
    """Every launch at TILED on SMALL, from a temporary config file."""
    runs = {name: _runs(name) for name in KERNELS}
    with small_block_configs(tmp_path_factory.mktemp("configs"), runs, SMALL, MODULES) as cf:
        yield cf


@pytest.mark.parametrize("name", [*KERNELS, *SCAN])
def test_interpreter_small_blocks(name, small_blocks):
    assert_interpreter_matches_reference(*_runs(name))


def test_interpreter_default_config_matches_mamba_ssm():
    forward = tuple(name for name in KERNELS if registry.get(name).phase.startswith("fwd"))
    assert_interpreter_matches_mamba_ssm(forward, MODULES)


# ---------------------------------------------------------------------------------------------------
# GPU: every suite shape, bf16, against mamba-ssm


@pytest.mark.gpu
@pytest.mark.parametrize("shape_name", suites.load().suites["default"])
@pytest.mark.parametrize("name", KERNELS)
def test_gpu_matches_mamba_ssm(name, shape_name):
    assert_gpu_matches_mamba_ssm(name, shape_name)
