"""Tests of the Helion gated RMSNorm (mamba2_kernels/norm/gated_rmsnorm.py, mamba2_kernels/norm/rmsnorm.py).

Against the fp64 references of mamba2_kernels/norm/naive.py in Helion's ref mode and in the Triton interpreter
(tiling and masking for real, with block sizes smaller than the dimensions), against mamba-ssm's
``_layer_norm_fwd``/``_layer_norm_bwd`` in the interpreter, mamba-ssm's gated-norm accuracy criterion in
fp16, and gradcheck of ``rmsnorm_fn`` in fp64.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from mamba2_kernels import registry, testing
from mamba2_kernels.norm import gated_rmsnorm as G
from mamba2_kernels.norm import naive
from mamba2_kernels.norm.rmsnorm import RMSNormGated, rmsnorm_fn

M, N = 37, 64  # M not a multiple of any block size
COMBOS = list(itertools.product([False, True], [False, True], [False, True], [None, 16]))
IDS = [f"z{int(z)}-b{int(b)}-nbg{int(n)}-g{g or N}" for z, b, n, g in COMBOS]
# Every pair of two options' values together, in 5 of the 16 combinations: in Triton's interpreter each one
# compiles kernels of its own, seconds each (ref mode runs all 16).
PAIRWISE = [(False, False, False, None), (False, True, True, 16), (True, False, True, 16), (True, True, False, 16),
            (True, True, True, None)]


def _inputs(has_z, has_bias, dtype=torch.float32, seed=0, m=M, n=N):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    return dict(
        x=rnd(m, n), z=rnd(m, n) if has_z else None, weight=(1 + rnd(n, scale=0.3)),
        bias=rnd(n, scale=0.1) if has_bias else None, dy=rnd(m, n, scale=0.5),
    )


def _f64(t):
    return t.double() if t is not None else None


def _reference(inp, group_size, nbg, eps=1e-5):
    y, _, rstd = naive.gated_rmsnorm_fwd(_f64(inp["x"]), _f64(inp["weight"]), _f64(inp["bias"]), eps,
                                         z=_f64(inp["z"]), group_size=group_size, norm_before_gate=nbg)
    grads = naive.gated_rmsnorm_bwd(_f64(inp["dy"]), _f64(inp["x"]), _f64(inp["weight"]), _f64(inp["bias"]),
                                    eps, None, rstd, z=_f64(inp["z"]), group_size=group_size,
                                    norm_before_gate=nbg)
    return y, rstd, grads


def _ours(inp, group_size, nbg, eps=1e-5):
    y, mean, rstd = G.gated_rmsnorm_fwd(inp["x"], inp["weight"], inp["bias"], eps, z=inp["z"],
                                        group_size=group_size, norm_before_gate=nbg)
    assert mean is None
    grads = G.gated_rmsnorm_bwd(inp["dy"], inp["x"], inp["weight"], inp["bias"], eps, None, rstd, z=inp["z"],
                                group_size=group_size, norm_before_gate=nbg)
    return y, rstd, grads


def _assert_close(ours, ref, atol, rtol):
    y, rstd, grads = ours
    y_r, rstd_r, grads_r = ref
    assert rstd.dtype == torch.float32 and rstd.shape == rstd_r.shape
    torch.testing.assert_close(y.double(), y_r, atol=atol, rtol=rtol)
    torch.testing.assert_close(rstd.double(), rstd_r, atol=atol, rtol=rtol)
    for name, a, b in zip(("dx", "dw", "db", "dz"), grads, grads_r, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a.double(), b, atol=atol, rtol=rtol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("has_z,has_bias,nbg,group_size", COMBOS, ids=IDS)
def test_ref_mode_fp32(has_z, has_bias, nbg, group_size):
    inp = _inputs(has_z, has_bias)
    with testing.execution_mode("ref"):
        ours = _ours(inp, group_size, nbg)
    _assert_close(ours, _reference(inp, group_size, nbg), 2e-5, 2e-5)


@pytest.mark.parametrize("has_z,has_bias,nbg,group_size", PAIRWISE, ids=[IDS[COMBOS.index(c)] for c in PAIRWISE])
def test_interpreter_fp32(has_z, has_bias, nbg, group_size):
    # Helion's default configs here tile rows by 32 (fwd) and 16 (bwd) < M = 37.
    inp = _inputs(has_z, has_bias)
    with testing.execution_mode("triton"):
        ours = _ours(inp, group_size, nbg)
    _assert_close(ours, _reference(inp, group_size, nbg), 2e-5, 2e-5)


def test_interpreter_explicit_small_blocks_fp16():
    """Configs with blocks smaller than every dimension: several row chunks of partial dw/db sums."""
    inp = _inputs(True, True, torch.float16, seed=3)
    gs, ngroups = 16, N // 16
    x3, z3, dy3 = (inp[k].view(M, ngroups, gs) for k in ("x", "z", "dy"))
    w2, b2 = inp["weight"].view(ngroups, gs), inp["bias"].view(ngroups, gs)
    ref = _reference(inp, gs, False)
    with testing.execution_mode("triton"):
        fwd = G.gated_rmsnorm_fwd_kernel.helion_kernel({"block_sizes": [8, 2], "num_warps": 2}, "compiled")
        y3, rstd = fwd(x3, z3, w2, b2, 1e-5, False)
        bwd = G.gated_rmsnorm_bwd_kernel.helion_kernel({"block_sizes": [16, 2, 4], "num_warps": 2}, "compiled")
        dx3, dz3, dw, db = bwd(dy3, x3, z3, w2, b2, rstd, torch.empty_like(z3), False)
    ours = (y3.view(M, N), rstd.view(-1), (dx3.view(M, N), dw.view(N), db.view(N), dz3.view(M, N)))
    _assert_close(ours, ref, 1e-2, 1e-2)


@pytest.mark.parametrize("mode", testing.MODES)
@pytest.mark.parametrize("nbg", [False, True])
def test_given_dz_is_filled_in_place(nbg, mode):
    """z and dz as the layer hands them: column slices of wider buffers (strided rows); the kernel writes dz."""
    inp = _inputs(True, True)
    z, _ = testing.column_slice((M, N), row_dims=1)
    z.copy_(inp["z"])
    dz, buffer = testing.column_slice((M, N), row_dims=1)
    with testing.execution_mode(mode):
        _, _, rstd = G.gated_rmsnorm_fwd(inp["x"], inp["weight"], inp["bias"], 1e-5, z=z, group_size=16,
                                         norm_before_gate=nbg)
        args = (inp["dy"], inp["x"], inp["weight"], inp["bias"], 1e-5, None, rstd, z)
        want = G.gated_rmsnorm_bwd(*args, group_size=16, norm_before_gate=nbg)
        got = G.gated_rmsnorm_bwd(*args, group_size=16, norm_before_gate=nbg, dz=dz)
    assert got[3] is dz
    for name, a, b in zip(("dx", "dw", "db", "dz"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    assert torch.isnan(buffer).sum() == buffer.numel() - dz.numel(), "a write beside dz"


@pytest.mark.parametrize(("dz", "with_z", "message"), [
    (torch.empty(M, N + 1), True, r"dz: expected a torch.float32 tensor of shape \(37, 64\)"),
    (torch.empty(M, N, dtype=torch.float16), True, "dz: expected a torch.float32 tensor"),
    (torch.empty(N, M).t(), True, "dz: expected .* with stride 1 in dim -1"),
    (torch.empty(M, N), False, "dz: given without z"),
])
def test_wrong_dz_is_refused(dz, with_z, message):
    inp = _inputs(with_z, False)
    rstd = torch.ones(M)
    with testing.execution_mode("ref"), pytest.raises(ValueError, match=message):
        G.gated_rmsnorm_bwd(inp["dy"], inp["x"], inp["weight"], None, 1e-5, None, rstd, inp["z"], dz=dz)


@pytest.mark.parametrize("nbg", [False, True])
def test_mamba_ssm_criterion_fp16(nbg):
    """mamba-ssm's test_layernorm_gated criterion: error against the fp32-upcast reference <= 2x the error
    of PyTorch in the same dtype + atol."""
    inp = _inputs(True, True, torch.float16, seed=5, m=64, n=128)
    eps, gs, atol = 1e-5, 64, 1e-3
    ref32 = _reference({k: v.float() if v is not None else None for k, v in inp.items()}, gs, nbg, eps)
    with testing.execution_mode("triton"):
        ours = _ours(inp, gs, nbg, eps)
    y_pt, _ = naive._forward(inp["x"], inp["weight"], inp["bias"], eps, inp["z"], gs, nbg)
    grads_pt = naive.gated_rmsnorm_bwd(inp["dy"], inp["x"], inp["weight"], inp["bias"], eps, None, None,
                                       z=inp["z"], group_size=gs, norm_before_gate=nbg)
    pairs = [(ours[0], y_pt, ref32[0])] + list(zip(ours[2], grads_pt, ref32[2], strict=True))
    for name, (a, p, r) in zip(("y", "dx", "dw", "db", "dz"), pairs, strict=True):
        err = (a.double() - r).abs().max().item()
        err_pt = (p.double() - r).abs().max().item()
        assert err <= 2 * err_pt + atol, f"{name}: {err} > 2 * {err_pt} + {atol}"


@pytest.mark.parametrize("name", ["gated_rmsnorm_fwd", "gated_rmsnorm_bwd"])
def test_against_mamba_ssm_interpreter(name, smoke_shape):
    entry = registry.get(name)
    inputs = entry.inputs(smoke_shape, seed=1)
    with testing.execution_mode("triton"):
        ours = entry.run_helion(inputs)
        base = entry.run_baseline(inputs)
    assert set(ours) == set(base)
    for key in ours:
        torch.testing.assert_close(ours[key], base[key], atol=1e-5, rtol=1e-5)


def test_gradcheck_rmsnorm_fn_fp64():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    z = torch.randn(2, 3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = (1 + 0.3 * torch.randn(8, generator=g, dtype=torch.float64)).requires_grad_()
    b = (0.1 * torch.randn(8, generator=g, dtype=torch.float64)).requires_grad_()
    with testing.execution_mode("ref"):
        for nbg in (False, True):
            assert torch.autograd.gradcheck(
                lambda x, z, w, b, nbg=nbg: rmsnorm_fn(x, w, b, z=z, eps=1e-5, group_size=4, norm_before_gate=nbg),
                (x, z, w, b))
        assert torch.autograd.gradcheck(lambda x, w: rmsnorm_fn(x, w, None, eps=1e-5), (x, w))


def test_module_matches_reference():
    torch.manual_seed(0)
    module = RMSNormGated(32, eps=1e-5, group_size=16, norm_before_gate=False)
    with torch.no_grad():
        module.weight.mul_(torch.rand(32) + 0.5)
    x = torch.randn(2, 5, 32, requires_grad=True)
    z = torch.randn(2, 5, 32, requires_grad=True)
    with testing.execution_mode("ref"):
        y = module(x, z)
        y.square().sum().backward()
    x64, z64, w64 = (t.detach().double().requires_grad_() for t in (x, z, module.weight))
    y_ref, _ = naive._forward(x64.reshape(-1, 32), w64, None, 1e-5, z64.reshape(-1, 32), 16, False)
    torch.testing.assert_close(y.detach().double(), y_ref.detach().view(2, 5, 32), atol=1e-5, rtol=1e-5)
    y_ref.square().sum().backward()
    for name, ours, ref in (("x", x.grad, x64.grad), ("z", z.grad, z64.grad), ("weight", module.weight.grad, w64.grad)):
        torch.testing.assert_close(ours.double(), ref, atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"d{n}: {m}")


def test_rejects_layer_norm():
    inp = _inputs(False, False)
    with pytest.raises(NotImplementedError, match="is_rms_norm"):
        G.gated_rmsnorm_fwd(inp["x"], inp["weight"], None, 1e-5, is_rms_norm=False)


@pytest.mark.gpu
@pytest.mark.parametrize("nbg", [False, True])
def test_gpu_bf16_against_reference_and_mamba_ssm(nbg):
    inp = {k: v.cuda() if v is not None else None for k, v in _inputs(True, False, torch.bfloat16, 11,
                                                                      m=1000, n=1024).items()}
    gs = 256
    ours = _ours(inp, gs, nbg)
    ref = _reference(inp, gs, nbg)
    _assert_close(ours, ref, 5e-2, 5e-2)
    base = registry.get("gated_rmsnorm_fwd").baseline_fn()(inp["x"], inp["weight"], None, 1e-5, inp["z"], None,
                                                           gs, nbg, True)
    torch.testing.assert_close(ours[0], base[0], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ours[1], base[2], atol=1e-4, rtol=1e-4)
