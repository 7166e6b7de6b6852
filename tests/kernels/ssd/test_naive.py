"""Tests of the SSD references in mamba2_kernels/ssd/naive.py.

1. Each stage reference against the mamba-ssm wrapper it mirrors, run by Triton's CPU interpreter (fp32).
2. fp64: the chunked reference against the per-step recurrence and mamba-ssm's ``ssd_minimal_discrete``.
3. fp64: ``ssd_chunked_bwd_ref`` (the backward references, composed as mamba-ssm composes its kernels)
   against torch.autograd through ``ssd_chunked_ref``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from mamba2_kernels.ssd import naive as N

H, P, N_STATE, Q = 4, 16, 16, 32
INF_LIMIT = (0.0, float("inf"))


# ----------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------


def _seq_idx(batch: int, seqlen: int) -> torch.Tensor:
    # Row 0: boundaries inside chunk 0 and on a chunk border (64). Row 1 starts at sequence 1, so
    # initial_states (which belong to sequence 0) do not apply to it; boundary inside chunk 1.
    rows = [[0] * 20 + [1] * 44 + [2] * (seqlen - 64), [1] * 50 + [3] * (seqlen - 50)]
    return torch.tensor(rows[:batch], dtype=torch.int32)


def make_inputs(batch, seqlen, ngroups, *, D=None, z=False, dt_bias=False, softplus=False, limit=None,
                init=False, seq=False, dtype=torch.float32, seed=0):
    """Random inputs of ``mamba_chunk_scan_combined``; D is None, "h" or "hp"."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    if softplus:  # raw dt around 0 so that softplus gives dt in about (0.05, 1.3)
        dt = (torch.rand(batch, seqlen, H, generator=g, dtype=torch.float64) * 4 - 3).to(dtype)
    else:
        dt = (torch.rand(batch, seqlen, H, generator=g, dtype=torch.float64) * 0.5 + 0.05).to(dtype)
    return dict(
        x=rnd(batch, seqlen, H, P),
        dt=dt,
        A=(-torch.rand(H, generator=g, dtype=torch.float64) * 2 - 0.3).to(dtype),
        B=rnd(batch, seqlen, ngroups, N_STATE, scale=0.5),
        C=rnd(batch, seqlen, ngroups, N_STATE, scale=0.5),
        D=None if D is None else rnd(*((H,) if D == "h" else (H, P))),
        z=rnd(batch, seqlen, H, P) if z else None,
        dt_bias=rnd(H, scale=0.5) if dt_bias else None,
        initial_states=rnd(batch, H, P, N_STATE) if init else None,
        seq_idx=_seq_idx(batch, seqlen) if seq else None,
        dt_softplus=softplus,
        dt_limit=limit if limit is not None else INF_LIMIT,
    )


def _err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def assert_close(ref, exp, rtol, name=""):
    """max |ref - exp| <= rtol * max(|exp|, 1)."""
    assert ref.shape == exp.shape, (name, ref.shape, exp.shape)
    err = _err(ref, exp)
    scale = max(exp.double().abs().max().item() if exp.numel() else 0.0, 1.0)
    assert err <= rtol * scale, f"{name}: max abs error {err:.3g} > {rtol:g} * {scale:.3g}"
    return err


# ----------------------------------------------------------------------------------------------------
# 1. Each stage against mamba-ssm under Triton's interpreter (fp32)
# ----------------------------------------------------------------------------------------------------

CASES = {  # dfinal: whether the backward gets a gradient of final_states
    "b1-L64-g1-Dh-dfinal": dict(batch=1, seqlen=64, ngroups=1, D="h", dfinal=True),
    "b2-L80-g2-Dhp-z-bias-softplus-limit-init": dict(
        batch=2, seqlen=80, ngroups=2, D="hp", z=True, dt_bias=True, softplus=True, limit=(0.1, 0.9),
        init=True, dfinal=False),
    "b2-L80-g4-Dh-z-bias-softplus-init-seq-dfinal": dict(
        batch=2, seqlen=80, ngroups=4, D="h", z=True, dt_bias=True, softplus=True, init=True, seq=True,
        dfinal=True),
}

STAGES = [
    "chunk_cumsum_fwd", "chunk_state_fwd", "state_passing_fwd", "bmm_chunk_fwd", "bmm_chunk_fwd_causal",
    "chunk_scan_fwd", "chunk_scan_bwd_dz", "chunk_scan_bwd_dstates", "state_passing_bwd",
    "chunk_scan_chunk_state_bwd_dx", "chunk_state_bwd_db", "chunk_scan_bwd_dC", "chunk_scan_bwd_dcb",
    "chunk_scan_bwd_dcb_with_CB", "bmm_chunk_bwd", "chunk_scan_bwd_ddAcs_stable", "chunk_cumsum_bwd",
]


@pytest.fixture(scope="module")
def mamba():
    """mamba-ssm's SSD wrappers under Triton's CPU interpreter (deterministic: one config per kernel)."""
    from mamba2_kernels import _mamba_ssm as ms
    from mamba2_kernels import testing

    testing.enable_cpu_interpret()
    mods = SimpleNamespace(
        chunk_state=ms.module(ms.SSD_CHUNK_STATE),
        state_passing=ms.module(ms.SSD_STATE_PASSING),
        bmm=ms.module(ms.SSD_BMM),
        chunk_scan=ms.module(ms.SSD_CHUNK_SCAN),
        combined=ms.module(ms.SSD_COMBINED),
    )
    if type(mods.combined._chunk_scan_chunk_state_bwd_dx_kernel.fn).__name__ != "InterpretedFunction":
        pytest.skip("mamba-ssm's Triton modules were imported before TRITON_INTERPRET=1 was set")
    return mods


def _run_stages(m, case):
    """Run mamba-ssm's wrappers in the order of one fwd+bwd of mamba_chunk_scan_combined, and each
    reference on the very same inputs. Returns {stage: [(name, ref, mamba), ...]}."""
    case = dict(case)
    dfinal_on = case.pop("dfinal")
    t = make_inputs(**case)
    x, dt, A, B, C, D, z = (t[k] for k in ("x", "dt", "A", "B", "C", "D", "z"))
    dt_bias, init, seq_idx, sp, lim = (t[k] for k in ("dt_bias", "initial_states", "seq_idx", "dt_softplus",
                                                      "dt_limit"))
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    cs, sp_mod, bmm, sc, comb = m.chunk_state, m.state_passing, m.bmm, m.chunk_scan, m.combined
    g = torch.Generator().manual_seed(1)
    res = {}

    def rec(stage, names, ref, exp):
        ref = ref if isinstance(ref, tuple) else (ref,)
        exp = exp if isinstance(exp, tuple) else (exp,)
        assert len(ref) == len(exp) == len(names), (stage, len(ref), len(exp))
        for name, r, e in zip(names, ref, exp, strict=True):
            assert (r is None) == (e is None), (stage, name)
        res[stage] = [item for item in zip(names, ref, exp, strict=True) if item[1] is not None]

    # Forward.
    args = (dt, A, Q, dt_bias, sp, lim)
    dA_cs, dt_c = cs._chunk_cumsum_fwd(*args)
    rec("chunk_cumsum_fwd", ["dA_cumsum", "dt_out"], N.chunk_cumsum_fwd(*args), (dA_cs, dt_c))

    args = (B, x, dt_c, dA_cs, seq_idx)
    states = cs._chunk_state_fwd(*args)
    rec("chunk_state_fwd", ["states"], N.chunk_state_fwd(*args), states)

    init_flat = None if init is None else init.flatten(-2)
    args = (states.flatten(-2), dA_cs[..., -1], init_flat, seq_idx, Q)
    prev_states, final = sp_mod._state_passing_fwd(*args, out_dtype=C.dtype)
    rec("state_passing_fwd", ["states", "final_states"], N.state_passing_fwd(*args, out_dtype=C.dtype),
        (prev_states, final))
    prev_states = prev_states.unflatten(-1, (headdim, dstate))

    CB = bmm._bmm_chunk_fwd(C, B, Q, seq_idx=seq_idx, output_dtype=torch.float32)
    rec("bmm_chunk_fwd", ["CB"], N.bmm_chunk_fwd(C, B, Q, seq_idx=seq_idx, output_dtype=torch.float32), CB)
    # causal: mamba-ssm only defines the lower triangle.
    cb_causal = bmm._bmm_chunk_fwd(C, B, Q, seq_idx=seq_idx, causal=True)
    rec("bmm_chunk_fwd_causal", ["CB.tril"],
        N.bmm_chunk_fwd(C, B, Q, seq_idx=seq_idx, causal=True).tril(), cb_causal.tril())

    args = (CB, x, dt_c, dA_cs, C, prev_states, D, z, seq_idx)
    out, out_x = sc._chunk_scan_fwd(*args)
    ref = N.chunk_scan_fwd(*args)
    rec("chunk_scan_fwd", ["out", "out_x"], ref, (out, out_x))

    # Backward, as _mamba_chunk_scan_combined_bwd.
    dout = torch.randn(out.shape, generator=g)
    dfinal = torch.randn(final.shape, generator=g).unflatten(-1, (headdim, dstate)) if dfinal_on else None
    states_fp32, _ = sp_mod._state_passing_fwd(states.flatten(-2), dA_cs[..., -1], init_flat, seq_idx, Q)
    if z is not None:
        args = (x, z, out_x, dout, Q)
        kw = dict(has_ddAcs=True, D=D, recompute_output=True)
        exp = sc._chunk_scan_bwd_dz(*args, **kw)
        rec("chunk_scan_bwd_dz", ["dz", "dout_x", "dD", "ddA_cumsum", "outz"], N.chunk_scan_bwd_dz(*args, **kw),
            exp)
        dout_x = exp[1]
    else:
        dout_x = dout

    args = (C, dA_cs, dout_x, seq_idx)
    dstates = sc._chunk_scan_bwd_dstates(*args, dtype=torch.float32)
    rec("chunk_scan_bwd_dstates", ["dstates"], N.chunk_scan_bwd_dstates(*args, dtype=torch.float32), dstates)

    args = (states_fp32, dA_cs[..., -1], dstates.flatten(-2))
    kw = dict(dfinal_states=None if dfinal is None else dfinal.flatten(-2), seq_idx=seq_idx,
              has_initial_states=init is not None, dstates_dtype=x.dtype, states_dtype=x.dtype, chunk_size=Q)
    exp = sp_mod._state_passing_bwd(*args, **kw)
    rec("state_passing_bwd", ["dstates", "ddA_chunk_cumsum", "dinitial_states", "states"],
        N.state_passing_bwd(*args, **kw), exp)
    dstates_p, ddA_chunk, _, states_conv = exp
    dstates_p = dstates_p.unflatten(-1, (headdim, dstate))
    states_conv = states_conv.unflatten(-1, (headdim, dstate))

    args = (x, dt_c, dA_cs, B, CB, dout_x, dstates_p, D, seq_idx)
    dx, ddt, dD_x = comb._chunk_scan_chunk_state_bwd_dx(*args)
    rec("chunk_scan_chunk_state_bwd_dx", ["dx", "ddt", "dD"], N.chunk_scan_chunk_state_bwd_dx(*args),
        (dx, ddt, dD_x))

    args = (x, dt_c, dA_cs, dstates_p, seq_idx)
    dB, ddA_next = cs._chunk_state_bwd_db(*args, B=B, ngroups=ngroups)
    rec("chunk_state_bwd_db", ["dB", "ddA_next"], N.chunk_state_bwd_db(*args, B=B, ngroups=ngroups),
        (dB, ddA_next))

    args = (states_conv, dA_cs, dout_x, seq_idx)
    dC, ddA_prev = sc._chunk_scan_bwd_dC(*args, C=C, ngroups=ngroups)
    rec("chunk_scan_bwd_dC", ["dC", "ddA_cumsum_prev"], N.chunk_scan_bwd_dC(*args, C=C, ngroups=ngroups),
        (dC, ddA_prev))

    args = (x, dt_c, dA_cs, dout_x, seq_idx)
    dCB = sc._chunk_scan_bwd_dcb(*args, ngroups=ngroups)
    rec("chunk_scan_bwd_dcb", ["dCB"], N.chunk_scan_bwd_dcb(*args, ngroups=ngroups), dCB)
    if seq_idx is None:  # mamba-ssm's CB= path (unused by the combined bwd) has no seq_idx support
        args = (x, dt_c, dA_cs, dout_x, None, CB)
        rec("chunk_scan_bwd_dcb_with_CB", ["dCB", "ddA"], N.chunk_scan_bwd_dcb(*args, ngroups=ngroups),
            sc._chunk_scan_bwd_dcb(*args, ngroups=ngroups))

    dB_tot = bmm._bmm_chunk_bwd(C, dCB, residual=dB)
    dC_tot = bmm._bmm_chunk_bwd(B, dCB.transpose(-1, -2), residual=dC)
    rec("bmm_chunk_bwd", ["dB", "dC", "dB_no_residual"],
        (N.bmm_chunk_bwd(C, dCB, residual=dB), N.bmm_chunk_bwd(B, dCB.transpose(-1, -2), residual=dC),
         N.bmm_chunk_bwd(C, dCB)),
        (dB_tot, dC_tot, bmm._bmm_chunk_bwd(C, dCB)))

    args = (x, dt_c, dA_cs, dout_x, CB)
    ddA = sc._chunk_scan_bwd_ddAcs_stable(*args)
    rec("chunk_scan_bwd_ddAcs_stable", ["ddA"], N.chunk_scan_bwd_ddAcs_stable(*args), ddA)

    ddA_prev = ddA_prev.clone()
    ddA_prev[..., -1] += ddA_chunk
    ddA_total = ddA + ddA_next + ddA_prev.flip(-1).cumsum(-1).flip(-1)
    args = (ddA_total, ddt, dt, A, dt_bias, sp, lim)
    exp = cs._chunk_cumsum_bwd(*args)
    rec("chunk_cumsum_bwd", ["ddt", "dA", "ddt_bias"], N.chunk_cumsum_bwd(*args), exp)
    return res


_stage_cache: dict[str, dict] = {}


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("case", list(CASES))
def test_stage_matches_mamba(mamba, case, stage):
    if case not in _stage_cache:
        _stage_cache[case] = _run_stages(mamba, CASES[case])
    results = _stage_cache[case]
    if stage not in results:
        pytest.skip(f"{stage} does not apply to {case}")
    for name, ref, exp in results[stage]:
        assert ref.dtype == exp.dtype, (stage, name, ref.dtype, exp.dtype)  # fp32 inputs: same dtypes
        assert_close(ref, exp, 2e-5, f"{stage}.{name}")


def test_chunk_cumsum_padding():
    """Padded positions of the last chunk: dt_out = 0 (not f(0 + bias)), dA_cumsum flat."""
    t = make_inputs(1, 40, 1, dt_bias=True, softplus=True, limit=(0.2, 0.7))
    dA_cs, dt_out = N.chunk_cumsum_fwd(t["dt"], t["A"], Q, t["dt_bias"], True, (0.2, 0.7))
    assert dA_cs.shape == dt_out.shape == (1, H, 2, Q)
    assert (dt_out[:, :, 1, 8:] == 0).all()
    assert (dA_cs[:, :, 1, 8:] == dA_cs[:, :, 1, 7:8]).all()
    assert ((dt_out[:, :, 0] >= 0.2) & (dt_out[:, :, 0] <= 0.7)).all()


# ----------------------------------------------------------------------------------------------------
# 2. fp64: chunked == recurrence == ssd_minimal_discrete
# ----------------------------------------------------------------------------------------------------

F64 = torch.float64
FWD_CASES = {
    "g1": dict(batch=2, seqlen=64, ngroups=1),
    "g2-Dh-z-init": dict(batch=2, seqlen=64, ngroups=2, D="h", z=True, init=True),
    "g4-Dhp-bias-softplus-init": dict(batch=1, seqlen=64, ngroups=4, D="hp", dt_bias=True, softplus=True,
                                      init=True),
}


def _ssd_minimal():
    from mamba2_kernels import _mamba_ssm as ms
    from mamba2_kernels import testing

    testing.enable_cpu_interpret()  # ssd_minimal imports mamba-ssm's Triton modules
    return ms.module(ms.SSD_MINIMAL).ssd_minimal_discrete


def _fwd(fn, t, chunk_size=Q):
    return fn(t["x"], t["dt"], t["A"], t["B"], t["C"], chunk_size, D=t["D"], z=t["z"], dt_bias=t["dt_bias"],
              initial_states=t["initial_states"], seq_idx=t["seq_idx"], dt_softplus=t["dt_softplus"],
              dt_limit=t["dt_limit"], return_final_states=True)


@pytest.mark.parametrize("case", list(FWD_CASES))
def test_chunked_matches_recurrence_and_minimal(case):
    t = make_inputs(**FWD_CASES[case], dtype=F64)
    out, final = _fwd(N.ssd_chunked_ref, t)
    out_r, final_r = _fwd(N.ssd_recurrent_ref, t)
    assert out.dtype == final.dtype == F64
    assert_close(out, out_r, 1e-12, "out vs recurrence")
    assert_close(final, final_r, 1e-12, "final_states vs recurrence")
    for q in (16, 64):  # the chunk size must not matter
        out_q, final_q = _fwd(N.ssd_chunked_ref, t, chunk_size=q)
        assert_close(out_q, out_r, 1e-12, f"out Q={q}")
        assert_close(final_q, final_r, 1e-12, f"final Q={q}")

    # ssd_minimal_discrete: pre-multiplied X*dt and A*dt, per-head B/C, no D/z.
    dt = t["dt"] if t["dt_bias"] is None else t["dt"] + t["dt_bias"]
    dt = F.softplus(dt) if t["dt_softplus"] else dt
    init = t["initial_states"]
    y, final_m = _ssd_minimal()(t["x"] * dt[..., None], t["A"] * dt, t["B"].repeat_interleave(H // t["B"].shape[2], 2),
                                t["C"].repeat_interleave(H // t["C"].shape[2], 2), Q,
                                initial_states=None if init is None else init[:, None])
    if t["D"] is not None:
        y = y + t["x"] * (t["D"][:, None] if t["D"].dim() == 1 else t["D"])
    if t["z"] is not None:
        y = y * F.silu(t["z"])
    assert_close(out, y, 1e-12, "out vs ssd_minimal_discrete")
    assert_close(final, final_m, 1e-12, "final_states vs ssd_minimal_discrete")


@pytest.mark.parametrize("seqlen", [64, 80])
@pytest.mark.parametrize("init", [False, True])
def test_chunked_matches_recurrence_seq_idx_dt_limit(seqlen, init):
    t = make_inputs(2, seqlen, 2, D="hp", z=True, dt_bias=True, softplus=True, limit=(0.1, 0.9), init=init,
                    seq=True, dtype=F64)
    out, final = _fwd(N.ssd_chunked_ref, t)
    out_r, final_r = _fwd(N.ssd_recurrent_ref, t)
    assert_close(out, out_r, 1e-12, "out")
    assert_close(final, final_r, 1e-12, "final_states")
    # Sequence 1 of row 0 (positions 20..63) must not depend on anything before it.
    t2 = dict(t, x=t["x"].clone())
    t2["x"][0, :20] += 1.0
    out2, _ = _fwd(N.ssd_chunked_ref, t2)
    assert torch.equal(out2[0, 20:], out[0, 20:])


# ----------------------------------------------------------------------------------------------------
# 3. fp64: the backward references, composed, against autograd
# ----------------------------------------------------------------------------------------------------

GRAD_CASES = {
    "g1-L64": dict(batch=1, seqlen=64, ngroups=1),
    "g2-L80-Dhp-z-bias-softplus-limit-init": dict(batch=2, seqlen=80, ngroups=2, D="hp", z=True, dt_bias=True,
                                                  softplus=True, limit=(0.1, 0.9), init=True),
    "g4-L80-Dh-bias-init-seq": dict(batch=2, seqlen=80, ngroups=4, D="h", dt_bias=True, softplus=True,
                                    init=True, seq=True),
    "g2-L80-Dh-z-seq-nofinal": dict(batch=2, seqlen=80, ngroups=2, D="h", z=True, seq=True),
}
GRAD_NAMES = ["x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states"]


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_bwd_composition_matches_autograd(case):
    t = make_inputs(**GRAD_CASES[case], dtype=F64)
    with_final = t["initial_states"] is not None
    leaves = {k: t[k].clone().requires_grad_() for k in GRAD_NAMES if t[k] is not None}
    out, final = _fwd(N.ssd_chunked_ref, {**t, **leaves})
    g = torch.Generator().manual_seed(2)
    dout = torch.randn(out.shape, generator=g, dtype=F64)
    dfinal = torch.randn(final.shape, generator=g, dtype=F64) if with_final else None
    outputs, cotangents = ([out, final], [dout, dfinal]) if with_final else ([out], [dout])
    grads = dict(zip(leaves, torch.autograd.grad(outputs, list(leaves.values()), cotangents), strict=True))

    # mamba-ssm's bwd takes the pre-gate output when z is given.
    out_x = _fwd(N.ssd_chunked_ref, {**t, "z": None})[0] if t["z"] is not None else out.detach()
    res = N.ssd_chunked_bwd_ref(dout, t["x"], t["dt"], t["A"], t["B"], t["C"], out_x, Q, D=t["D"], z=t["z"],
                                dt_bias=t["dt_bias"], initial_states=t["initial_states"], dfinal_states=dfinal,
                                seq_idx=t["seq_idx"], dt_softplus=t["dt_softplus"], dt_limit=t["dt_limit"])
    assert len(res) == len(GRAD_NAMES)
    for name, r in zip(GRAD_NAMES, res, strict=True):
        if name not in grads:
            assert r is None, name
            continue
        assert r.dtype == F64, name
        assert_close(r, grads[name], 1e-11, f"d{name}")


def test_references_keep_fp64_and_mamba_dtypes():
    """fp64 inputs stay fp64 even where mamba-ssm forces fp32; other dtypes follow mamba-ssm."""
    t = make_inputs(1, 40, 2)
    dA_cs, dt_c = N.chunk_cumsum_fwd(t["dt"].half(), t["A"], Q)
    assert dA_cs.dtype == dt_c.dtype == torch.float32
    states = N.chunk_state_fwd(t["B"].half(), t["x"].half(), dt_c, dA_cs)
    assert states.dtype == torch.float32
    assert N.chunk_state_fwd(t["B"].half(), t["x"].half(), dt_c, dA_cs, states_in_fp32=False).dtype == torch.half
    cb = N.bmm_chunk_fwd(t["C"].double(), t["B"].double(), Q, output_dtype=torch.float32)
    assert cb.dtype == F64 and cb.shape == (1, math.ceil(40 / Q), 2, Q, Q)
    assert N.bmm_chunk_fwd(t["C"][:, :, 0], t["B"][:, :, 0], Q).shape == (1, 2, Q, Q)
