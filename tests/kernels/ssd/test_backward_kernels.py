"""The Helion SSD backward kernels (mamba2_kernels/ssd/{chunk_scan_bwd,chunk_state_passing_bwd,
chunk_scan_chunk_state_bwd,chunk_state_bwd,bmm_chunk_bwd,chunk_cumsum_bwd}.py) against the fp64 references of
mamba2_kernels/ssd/naive.py, and the full autograd of ``mamba2_kernels.mamba_chunk_scan_combined`` (the parity kernels:
parity/).

CPU: Helion ref mode at the smoke shape and odd shapes, plus the optional arguments (D per head / per
head dim / none, z outputs, dt_bias + softplus, dt_limit, initial and final states, seq_idx); Triton's
interpreter with a temporary config file whose block sizes are smaller than the dimensions (and head
splits, so partial sums are added); gradients of the combined function against autograd through the
fp64 reference, and ``torch.autograd.gradcheck``.
GPU (``-m gpu``): every suite shape, bf16, against mamba-ssm.
"""

from __future__ import annotations

import contextlib
import pickle

import pytest
import torch

import mamba2_kernels
from mamba2_kernels import registry, suites
from mamba2_kernels._runtime import pinned_config
from mamba2_kernels.ssd import (
    bmm_chunk_bwd,
    chunk_bwd_db_dc,
    chunk_cumsum_bwd,
    chunk_scan_bwd,
    chunk_scan_chunk_state_bwd,
    chunk_state_bwd,
    chunk_state_passing_bwd,
    naive,
)
from mamba2_kernels.testing import execution_mode

from .checks import (
    ODD,
    SMOKE,
    TILED,
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

MODULES = (chunk_scan_bwd, chunk_state_passing_bwd, chunk_scan_chunk_state_bwd, chunk_state_bwd, bmm_chunk_bwd,
           chunk_bwd_db_dc, chunk_cumsum_bwd)
KERNELS = entries_of(MODULES)
SMALL: dict = {  # block sizes (in register_block_size order) below every dimension they tile, one head/program
    "chunk_scan_bwd_dz": {"block_sizes": [16, 16]},
    "chunk_scan_bwd_dC": {"block_sizes": [16, 8, 16], "heads_per_program": 1},
    "chunk_scan_bwd_dcb": {"block_sizes": [16, 16, 16], "heads_per_program": 1},
    "chunk_state_passing_bwd": {"block_sizes": [16, 8]},  # headdim, dstate (the chunk is one tile)
    "chunk_scan_chunk_state_bwd_dx": {"block_sizes": [16, 16, 16, 8]},
    "chunk_state_bwd_db": {"block_sizes": [16, 8, 16], "heads_per_program": 1},
    "bmm_chunk_bwd": {"block_sizes": [16, 8, 16]},
    "chunk_bwd_db_dc": {"block_sizes": [16, 8, 16, 16]},  # rows, dstate, headdim, the dCB loop's chunk
    "chunk_cumsum_bwd": {"block_sizes": [2]},
}
SMALL["chunk_scan_bwd_dcb_ddA"] = SMALL["chunk_scan_bwd_dcb"]  # the same kernel, with CB (configs go by kernel)
SMALL["bmm_chunk_scan_bwd_dcb"] = SMALL["chunk_scan_bwd_dcb"]  # ... and making CB itself
SMALL["chunk_cumsum_bwd_terms"] = SMALL["chunk_cumsum_bwd"]


def _both(fn, ref_fn, args, atol=1e-4, rtol=1e-4, **kwargs):
    """Run ``fn`` in ref mode and ``ref_fn`` in fp64 on the same arguments; compare every output."""
    with execution_mode("ref"):
        ours = fn(*args, **kwargs)
    ref = ref_fn(*(f64(a) for a in args), **{k: f64(v) for k, v in kwargs.items()})
    ours, ref = (ours, ref) if isinstance(ref, tuple) else ((ours,), (ref,))
    close(ours, ref, atol, rtol, fn.__name__)
    return ours


# ---------------------------------------------------------------------------------------------------
# Ref mode: registry inputs at odd shapes, against the fp64 reference


@pytest.mark.parametrize("odd", list(ODD), ids=list(ODD))
@pytest.mark.parametrize("name", KERNELS)
def test_ref_mode_matches_fp64_reference(name, odd):
    assert_ref_mode_matches_reference(name, SMOKE.replace(**ODD[odd]))


@pytest.mark.parametrize("D_kind", ["none", "h", "hp"])
def test_dz_options(D_kind):
    inp = registry.get("chunk_scan_bwd_dz").inputs(SMOKE.replace(seqlen=80, batch=2), 1)
    D = {"none": None, "h": inp["D"], "hp": inp["D_per_dim"]}[D_kind]
    args = (inp["x"], inp["z"], inp["out_x"], inp["dout"], SMOKE.chunk_size)
    ours = _both(chunk_scan_bwd.chunk_scan_bwd_dz, naive.chunk_scan_bwd_dz, args, has_ddAcs=True, D=D,
                 recompute_output=True)
    assert len(ours) == 5 and (ours[2] is None) == (D is None)


@pytest.mark.parametrize("D_kind", ["none", "h", "hp"])
@pytest.mark.parametrize("seq", [False, True])
def test_dx_options(D_kind, seq):
    shape = SMOKE.replace(seqlen=90, batch=2)
    inp = registry.get("chunk_scan_chunk_state_bwd_dx").inputs(shape, 2)
    D = {"none": None, "h": inp["D"], "hp": torch.randn(shape.nheads, shape.headdim)}[D_kind]
    seq_idx = seq_idx_rows(shape.batch, shape.seqlen) if seq else None
    args = (inp["x"], inp["dt"], inp["dA_cumsum"], inp["B"], inp["cb"], inp["dout"], inp["dstates"])
    _both(chunk_scan_chunk_state_bwd.chunk_scan_chunk_state_bwd_dx, naive.chunk_scan_chunk_state_bwd_dx, args,
          D=D, seq_idx=seq_idx)


def test_seq_idx_db_dC_dcb():
    shape = SMOKE.replace(seqlen=90, batch=2, ngroups=1)
    inp = registry.get("chunk_state_bwd_db").inputs(shape, 3)
    seq_idx = seq_idx_rows(shape.batch, shape.seqlen)
    for B in (None, inp["B"]):
        _both(chunk_state_bwd.chunk_state_bwd_db, naive.chunk_state_bwd_db,
              (inp["x"], inp["dt"], inp["dA_cumsum"], inp["dstates"]), seq_idx=seq_idx, B=B, ngroups=1)
    for C in (None, inp["C"]):
        _both(chunk_scan_bwd.chunk_scan_bwd_dC, naive.chunk_scan_bwd_dC,
              (inp["prev_states"], inp["dA_cumsum"], inp["dout"]), seq_idx=seq_idx, C=C, ngroups=1)
    _both(chunk_scan_bwd.chunk_scan_bwd_dcb, naive.chunk_scan_bwd_dcb,
          (inp["x"], inp["dt"], inp["dA_cumsum"], inp["dout"]), seq_idx=seq_idx, ngroups=1)


@pytest.mark.parametrize("mode", ["ref", "triton"])
def test_db_dc_in_one_pass_with_seq_idx_into_strided_buffers(mode):
    """The fused dB and dC pass against the fp64 chain (naive), with packed documents at a ragged last chunk,
    writing into slices of one gradient buffer as the layer hands them; its ``unfinished`` ddA terms finish to
    the same. The interpreter runs blocks below every dimension (two dstate blocks of partials)."""
    shape = TILED.replace(dstate=32)
    inp = registry.get("chunk_bwd_db_dc").inputs(shape, 5)
    seq_idx = seq_idx_rows(shape.batch, shape.seqlen)
    args = [inp[k] for k in ("x", "dt", "dA_cumsum", "B", "C", "dout", "prev_states", "dstates", "dcb")]
    n = shape.ngroups * shape.dstate
    grad = torch.full((shape.batch, shape.seqlen, 2 * n + 8), float("nan"))
    dB = grad[..., 4:4 + n].unflatten(-1, (shape.ngroups, shape.dstate))
    dC = grad[..., 4 + n:4 + 2 * n].unflatten(-1, (shape.ngroups, shape.dstate))
    config = {**SMALL["chunk_bwd_db_dc"], "block_sizes": [16, 16, 16, 16]}
    with execution_mode(mode), pinned_config(chunk_bwd_db_dc.chunk_bwd_db_dc_kernel, config):
        ours = chunk_bwd_db_dc.chunk_bwd_db_dc(*args, seq_idx=seq_idx, dB=dB, dC=dC)
        partials = chunk_bwd_db_dc.chunk_bwd_db_dc(*args, seq_idx=seq_idx, unfinished=True)
    assert ours[0] is dB and ours[1] is dC
    assert grad[..., :4].isnan().all() and grad[..., -4:].isnan().all()  # nothing written outside the slices
    ref = naive.chunk_bwd_db_dc(*(f64(a) for a in args), seq_idx=seq_idx)
    close(ours, ref, 1e-4, 1e-4, "chunk_bwd_db_dc")
    assert partials[2].shape[-1] == partials[3].shape[-1] == (2 if mode == "triton" else 1)  # ref: whole tiles
    close(naive.finish_ddA_terms(torch.zeros_like(partials[2]), partials[2], partials[3])[1:], ref[2:], 1e-4, 1e-4,
          "finished partials")


@pytest.mark.parametrize("mode", ["ref", "triton"])
def test_dcb_stage_that_makes_cb_itself_gives_bmm_chunk_then_dcb(mode):
    """CB made in the dCB kernel against bmm_chunk then dCB with that CB (fp64 references): CB whole (every
    block, zero across sequences), dCB and the intra-chunk ddA, with packed documents at a ragged last chunk and
    a group's heads split over programs (the first split stores CB); the interpreter with blocks below every
    dimension."""
    shape = TILED.replace(seqlen=90, ngroups=2)
    inp = registry.get("bmm_chunk_scan_bwd_dcb").inputs(shape, 6)
    args = [inp[k] for k in ("x", "dt", "dA_cumsum", "dout", "B", "C")]
    seq_idx = seq_idx_rows(shape.batch, shape.seqlen)
    with execution_mode(mode), pinned_config(chunk_scan_bwd.chunk_scan_bwd_dcb_kernel, SMALL["chunk_scan_bwd_dcb"]):
        ours = chunk_scan_bwd.bmm_chunk_scan_bwd_dcb(*args, seq_idx=seq_idx, ngroups=shape.ngroups)
    ref = naive.bmm_chunk_scan_bwd_dcb(*(f64(a) for a in args), seq_idx=seq_idx, ngroups=shape.ngroups)
    close(ours, ref, 1e-4, 1e-4, "bmm_chunk_scan_bwd_dcb")


def test_db_dc_in_one_pass_gives_mamba_ssms_four_kernels_results():
    """Its default config against mamba-ssm's db and dC kernels and two bmm_chunk_bwd launches, both in Triton's
    interpreter: the same values and dtypes."""
    assert_interpreter_matches_mamba_ssm(("chunk_bwd_db_dc",), (chunk_bwd_db_dc,))


def test_unfinished_ddA_terms_are_the_partials_of_the_finished_ones():
    """The dB, dC and dCB stages' ``unfinished`` ddA (the SSD backward's form, several partials each with
    small blocks) finish to the drop-ins' results, and the last stage's kernel gives from them what the
    drop-in chunk_cumsum_bwd gives from the finished sum: Triton's interpreter, ragged last chunk."""
    shape = TILED.replace(batch=1, chunk_size=64, seqlen=96, dstate=32)  # dot blocks of 16 or more: two dstate blocks
    inp = registry.get("chunk_scan_bwd_dcb_ddA").inputs(shape, 4)
    cum = registry.get("chunk_cumsum_bwd").inputs(shape, 4)
    db_args = (inp["x"], inp["dt"], inp["dA_cumsum"], inp["dstates"])
    dc_args = (inp["prev_states"], inp["dA_cumsum"], inp["dout"])
    dcb_args = (inp["x"], inp["dt"], inp["dA_cumsum"], inp["dout"])
    groups = {"ngroups": shape.ngroups}
    configs = {chunk_state_bwd.chunk_state_bwd_db_kernel: {**SMALL["chunk_state_bwd_db"], "block_sizes": [16, 16, 16]},
               chunk_scan_bwd.chunk_scan_bwd_dC_kernel: {**SMALL["chunk_scan_bwd_dC"], "block_sizes": [16, 16, 16]},
               chunk_scan_bwd.chunk_scan_bwd_dcb_kernel: {**SMALL["chunk_scan_bwd_dcb"], "block_sizes": [16, 32, 16]},
               chunk_cumsum_bwd.chunk_cumsum_bwd_kernel: SMALL["chunk_cumsum_bwd"]}
    with execution_mode("triton"), contextlib.ExitStack() as stack:
        for kernel, config in configs.items():
            stack.enter_context(pinned_config(kernel, config))
        runs = {form: (chunk_state_bwd.chunk_state_bwd_db(*db_args, B=inp["B"], unfinished=form, **groups),
                       chunk_scan_bwd.chunk_scan_bwd_dC(*dc_args, C=inp["C"], unfinished=form, **groups),
                       chunk_scan_bwd.chunk_scan_bwd_dcb(*dcb_args, CB=inp["cb"], unfinished=form, **groups))
                for form in (False, True)}
        (_, next_steps), (_, prev_parts), (_, intra_steps) = runs[True]
        assert min(next_steps.shape[-1], prev_parts.shape[-1], intra_steps.shape[-1]) > 1
        chunk = cum["ddA"][..., -1].contiguous()
        rest = (cum["ddt_out"], cum["dt_raw"], cum["A"], cum["dt_bias"], True, (0.0, float("inf")))
        from_terms = chunk_cumsum_bwd.chunk_cumsum_bwd_of_terms(intra_steps, next_steps, prev_parts, chunk, *rest)
        (_, ddA_next), (_, ddA_prev), (_, ddA_intra) = runs[False]
        from_sum = chunk_cumsum_bwd.chunk_cumsum_bwd(naive.combine_ddA_terms(ddA_intra, ddA_next, ddA_prev, chunk),
                                                    *rest)
    for finished, unfinished in zip(runs[False], runs[True], strict=True):
        torch.testing.assert_close(unfinished[0], finished[0], atol=0, rtol=0)
    close(naive.finish_ddA_terms(intra_steps, next_steps, prev_parts), (ddA_intra, ddA_next, ddA_prev),
           atol=1e-6, rtol=1e-6, label="finished terms")
    close(from_terms, from_sum, atol=1e-5, rtol=1e-5, label="chunk_cumsum_bwd of the terms")


@pytest.mark.parametrize("mode", ["ref", "triton"])
@pytest.mark.parametrize("case", ["init_final_convert", "seq_idx"])
def test_chunk_state_passing_bwd_options(mode, case):
    """The fused pass against mamba-ssm's two stages chained (fp64 references): dfinal_states carried in,
    dinitial_states out and converted states, or sequences starting inside a chunk and on a chunk border;
    the interpreter with blocks below every dimension (so the ddA partials of several blocks are summed)."""
    shape = SMOKE.replace(seqlen=90, batch=2, headdim=32)
    inp = registry.get("chunk_state_passing_bwd").inputs(shape, 7)
    g = torch.Generator().manual_seed(8)
    kwargs = {"seq_idx": seq_idx_rows(shape.batch, shape.seqlen), "states_dtype": torch.float32}
    if case == "init_final_convert":
        kwargs = {"dfinal_states": torch.randn(shape.batch, shape.nheads, shape.headdim, shape.dstate, generator=g),
                  "has_initial_states": True, "dstates_dtype": torch.float16, "states_dtype": torch.float16}
    args = (inp["C"], inp["dA_cumsum"], inp["dout"], inp["states_fp32"])
    config = {"block_sizes": SMALL["chunk_state_passing_bwd"]["block_sizes"], "num_warps": 4}
    with execution_mode(mode), pinned_config(chunk_state_passing_bwd.chunk_state_passing_bwd_kernel, config):
        ours = chunk_state_passing_bwd.chunk_state_passing_bwd(*args, **kwargs)
    ref = naive.chunk_state_passing_bwd(*(f64(a) for a in args), **{k: f64(v) for k, v in kwargs.items()})
    tol = 2e-3 if case == "init_final_convert" else 1e-4
    close(ours, ref, tol, tol, "chunk_state_passing_bwd")
    assert ours[2] is None if case == "seq_idx" else ours[0].dtype == ours[2].dtype == ours[3].dtype == torch.float16


@pytest.mark.parametrize(("bias", "softplus", "limit"), [(False, False, (0.0, float("inf"))),
                                                           (True, True, (0.01, 0.05)),
                                                           (True, False, (-0.5, 0.5))])
def test_chunk_cumsum_bwd_options(bias, softplus, limit):
    inp = registry.get("chunk_cumsum_bwd").inputs(SMOKE.replace(seqlen=80, batch=2), 5)
    dt_raw = inp["dt_raw"] + (0.0 if softplus else 3.8)  # without softplus: dt values around (-0.5, 0.5)
    ours = _both(chunk_cumsum_bwd.chunk_cumsum_bwd, naive.chunk_cumsum_bwd,
                 (inp["ddA"], inp["ddt_out"], dt_raw, inp["A"], inp["dt_bias"] if bias else None, softplus, limit),
                 atol=1e-5, rtol=1e-5)
    assert (ours[2] is None) == (not bias)


@pytest.mark.parametrize("blocks", [(16, 16), (16, 32), (32, 16), (64, 64)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("seq", [False, True])
def test_dcb_fused_ddA_every_tiling(blocks, seq):
    """The fused ddA's column and row sums land in their tile's slots (on the diagonal, across it, below
    it), for square and oblong tiles, and with seq_idx through CB's zeros: Triton's interpreter, since
    ref mode runs whole-chunk tiles (and a dot's blocks are 16 or more, hence chunks of 64)."""
    shape = SMOKE.replace(seqlen=96, batch=2, chunk_size=64)
    inp = registry.get("chunk_scan_bwd_dcb_ddA").inputs(shape, 6)
    seq_idx = seq_idx_rows(shape.batch, shape.seqlen) if seq else None
    cb = inp["cb"]
    if seq:  # as the forward's CB is: zero across sequences
        cb = naive.bmm_chunk_fwd(inp["C"], inp["B"], shape.chunk_size, seq_idx=seq_idx, output_dtype=torch.float32)
    args = (inp["x"], inp["dt"], inp["dA_cumsum"], inp["dout"])
    config = {"block_sizes": [*blocks, 16], "heads_per_program": 1, "num_warps": 4}
    with execution_mode("triton"), pinned_config(chunk_scan_bwd.chunk_scan_bwd_dcb_kernel, config):
        ours = chunk_scan_bwd.chunk_scan_bwd_dcb(*args, seq_idx=seq_idx, CB=cb, ngroups=shape.ngroups)
    ref = naive.chunk_scan_bwd_dcb(*(f64(a) for a in args), seq_idx=f64(seq_idx), CB=f64(cb),
                                   ngroups=shape.ngroups)
    close(ours, ref, label="dcb, ddA")
    stable = naive.chunk_scan_bwd_ddAcs_stable(*(f64(a) for a in args), f64(cb))
    close(ours[1:], (stable,), label="ddA against the stable kernel's reference")


def test_dcb_tuner_check_compares_finished_outputs():
    """The tuner's check of a candidate against the default config: the fused ddA's partials differ in
    layout with the tiling, so it compares them finished (``dcb_sums``), and still catches a wrong one."""
    shape = SMOKE.replace(seqlen=96, batch=2, chunk_size=64)
    inp = registry.get("chunk_scan_bwd_dcb_ddA").inputs(shape, 6)
    kernel = chunk_scan_bwd.chunk_scan_bwd_dcb_kernel
    args = (inp["x"], inp["dt"], inp["dA_cumsum"], inp["dout"], None, inp["cb"], shape.ngroups,
            shape.nheads // shape.ngroups)
    raw = {}
    for blocks in ((16, 16), (64, 32)):
        config = {"block_sizes": [*blocks, 16], "heads_per_program": 1, "num_warps": 4}
        with execution_mode("triton"), pinned_config(kernel, config):
            raw[blocks] = kernel(*args)
    fine, coarse = raw[(16, 16)], raw[(64, 32)]
    assert fine[1].shape != coarse[1].shape
    check = pickle.loads(pickle.dumps(kernel.autotune_accuracy_check))  # Helion pickles it
    check(fine, coarse)
    steps = fine[1].clone()
    steps[0, 0, 0, 2, 5] += 1.0  # one column sum: every later position's ddA moves with it
    with pytest.raises(AssertionError, match="chunk_scan_bwd_dcb output 1"):
        check((fine[0], steps), coarse)


# ---------------------------------------------------------------------------------------------------
# Triton interpreter: small blocks and head splits from a temporary config file


@pytest.fixture(scope="module")
def small_blocks(tmp_path_factory):
    """Every launch at TILED on SMALL, from a temporary config file."""
    runs = {name: (registry.get(name), registry.get(name).helion_fn()) for name in SMALL}
    with small_block_configs(tmp_path_factory.mktemp("configs"), runs, SMALL, MODULES) as cf:
        yield cf


@pytest.mark.parametrize("name", list(SMALL))
def test_interpreter_small_blocks(name, small_blocks):
    entry = registry.get(name)
    assert_interpreter_matches_reference(entry, entry.helion_fn())


# ---------------------------------------------------------------------------------------------------
# Autograd of mamba2_kernels.mamba_chunk_scan_combined


def _problem(b, L, h, p, g, n, seed, dtype=torch.float32, options=()):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    args = {"x": randn(b, L, h, p), "dt": randn(b, L, h, scale=0.5) - 3.0,
            "A": (-torch.rand(h, generator=gen) * 4 - 0.5).to(dtype), "B": randn(b, L, g, n), "C": randn(b, L, g, n)}
    if "D_h" in options:
        args["D"] = randn(h)
    if "D_hp" in options:
        args["D"] = randn(h, p)
    if "z" in options:
        args["z"] = randn(b, L, h, p)
    if "dt_bias" in options:
        args["dt_bias"] = (torch.rand(h, generator=gen) - 2.0).to(dtype)
    if "init" in options:
        args["initial_states"] = randn(b, h, p, n)
    return args


GRAD_OPTIONS = {
    "plain": ((), {}),
    "D_h-softplus": (("D_h", "dt_bias"), {"dt_softplus": True}),
    "D_hp-z-limit-init": (("D_hp", "z", "dt_bias", "init"),
                          {"dt_softplus": True, "dt_limit": (0.01, 0.5), "return_final_states": True}),
    "seq_idx-init-z": (("D_h", "z", "init"), {"seq_idx": "seq", "return_final_states": True}),
}


@pytest.mark.parametrize("case", list(GRAD_OPTIONS))
@pytest.mark.parametrize(("L", "g"), [(80, 2), (64, 4)])
def test_autograd_matches_fp64_reference(case, L, g):
    tensors, kwargs = GRAD_OPTIONS[case]
    args = _problem(2, L, 4, 16, g, 16, seed=7, options=tensors)
    if kwargs.get("seq_idx") == "seq":
        kwargs = {**kwargs, "seq_idx": seq_idx_rows(2, L)}
    ours = {k: v.clone().requires_grad_() for k, v in args.items()}
    ref = {k: v.double().requires_grad_() for k, v in args.items()}
    with execution_mode("ref"):
        out = mamba2_kernels.mamba_chunk_scan_combined(**ours, chunk_size=32, **kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        grads = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)) for i, o in enumerate(outs)]
        torch.autograd.backward(outs, grads)
    ref_out = naive.ssd_chunked_ref(**ref, chunk_size=32, **kwargs)
    ref_outs = ref_out if isinstance(ref_out, tuple) else (ref_out,)
    torch.autograd.backward(ref_outs, [gr.double() for gr in grads])
    for name in args:
        got, expected = ours[name].grad, ref[name].grad
        assert got is not None and got.dtype == args[name].dtype, name
        scale = expected.abs().max().item() + 1.0
        torch.testing.assert_close(got.double(), expected, atol=1e-5 * scale, rtol=1e-4, msg=name)


def test_gradcheck_tiny():
    # hl.dot takes no fp64, so the kernels run on fp32 copies of the fp64 leaves (the casts are
    # differentiable); finite differences therefore use a large step and loose tolerances. fast_mode
    # (random projections of the Jacobian) keeps it to seconds.
    args = _problem(1, 20, 2, 16, 1, 16, seed=11, dtype=torch.float64, options=("D_h", "z", "dt_bias", "init"))
    names = list(args)

    def fn(*tensors):
        kw = {k: v.float() for k, v in zip(names, tensors, strict=True)}
        out, final = mamba2_kernels.mamba_chunk_scan_combined(**kw, chunk_size=16, dt_softplus=True,
                                                       return_final_states=True)
        return out.double(), final.double()

    inputs = tuple(v.clone().requires_grad_() for v in args.values())
    with execution_mode("ref"):
        assert torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=2e-2, rtol=2e-2, nondet_tol=1e-5, fast_mode=True)


def test_patch_mamba_ssm_swaps_and_restores():
    from mamba2_kernels import _mamba_ssm

    combined = _mamba_ssm.module("ops.triton.ssd_combined")
    minimal = _mamba_ssm.module("modules.ssd_minimal")
    original = combined.mamba_chunk_scan_combined
    try:
        patched = mamba2_kernels.patch_mamba_ssm()
        assert "mamba_ssm.ops.triton.ssd_combined" in patched and "mamba_ssm.modules.ssd_minimal" in patched
        assert combined.mamba_chunk_scan_combined is mamba2_kernels.mamba_chunk_scan_combined
        assert minimal.mamba_chunk_scan_combined is mamba2_kernels.mamba_chunk_scan_combined
    finally:
        mamba2_kernels.unpatch_mamba_ssm()
    assert combined.mamba_chunk_scan_combined is original
    assert minimal.mamba_chunk_scan_combined is original


# ---------------------------------------------------------------------------------------------------
# GPU: every suite shape, bf16, against mamba-ssm


@pytest.mark.gpu
@pytest.mark.parametrize("shape_name", suites.load().suites["default"])
@pytest.mark.parametrize("name", KERNELS)
def test_gpu_matches_mamba_ssm(name, shape_name):
    assert_gpu_matches_mamba_ssm(name, shape_name)


@pytest.mark.gpu
@pytest.mark.parametrize("shape_name", suites.load().suites["default"])
def test_gpu_gradients_match_mamba_ssm(shape_name):
    from mamba2_kernels import _mamba_ssm

    theirs_fn = _mamba_ssm.resolve(f"{_mamba_ssm.SSD_COMBINED}:mamba_chunk_scan_combined")
    s = suites.load().shape(shape_name)
    args = _problem(s.batch, s.seqlen, s.nheads, s.headdim, s.ngroups, s.dstate, seed=0, dtype=s.torch_dtype,
                    options=("D_h", "z", "dt_bias", "init"))
    args = {k: v.cuda() for k, v in args.items()}
    kwargs = {"chunk_size": s.chunk_size, "dt_softplus": True, "return_final_states": True}
    grads = {}
    for label, fn in (("ours", mamba2_kernels.mamba_chunk_scan_combined), ("theirs", theirs_fn)):
        leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
        out, final = fn(**leaves, **kwargs)
        gen = torch.Generator(device="cuda").manual_seed(1)
        torch.autograd.backward([out, final], [torch.randn(out.shape, generator=gen, device="cuda").to(out.dtype),
                                               torch.randn(final.shape, generator=gen, device="cuda")])
        grads[label] = {k: v.grad for k, v in leaves.items()}
    for name, ref in grads["theirs"].items():
        got = grads["ours"][name]
        err = (got.float() - ref.float()).abs().max().item()
        assert err <= 2e-2 * (ref.float().abs().max().item() + 1.0), (name, err)


def test_head_splits_stop_at_four_parts_and_default_to_none():
    from mamba2_kernels.ssd._keys import heads_per_program

    assert heads_per_program(8).choices == (8, 4, 2)
    assert heads_per_program(64).choices == (64, 32, 16)
    assert heads_per_program(3).choices == (3, 1)
    assert heads_per_program(8).default() == 8
