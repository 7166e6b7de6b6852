"""mamba2_kernels._fastmath: exp through exp2, sigmoid through rsqrt and softplus through exp2 and log2, in plain
PyTorch, the Triton interpreter and (marked) on the GPU, where exp and sigmoid lower to the MUFU approximations."""

from __future__ import annotations

import helion
import helion.language as hl
import pytest
import torch

from mamba2_kernels import _fastmath as fastmath
from mamba2_kernels.testing import execution_mode

EDGES = torch.tensor([float("-inf"), -1e4, -88.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 88.0, 1e4, float("inf")])


@helion.kernel(static_shapes=True, autotune_effort="none")
def _exp_and_sigmoid(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    e, s = torch.empty_like(x), torch.empty_like(x)
    for tile in hl.tile(x.size(0)):
        e[tile] = fastmath.exp(x[tile])
        s[tile] = fastmath.sigmoid(x[tile])
    return e, s


@helion.kernel(static_shapes=True, autotune_effort="none")
def _softplus(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for tile in hl.tile(x.size(0)):
        out[tile] = fastmath.softplus(x[tile])
    return out


def _inputs(device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.cat([torch.empty(4000).uniform_(-30.0, 30.0, generator=g), EDGES]).to(device)


def _check(x: torch.Tensor, exp: torch.Tensor, sig: torch.Tensor, rtol: float) -> None:
    finite = x.abs() <= 80.0  # beyond, fp32 exp overflows, or goes subnormal and the GPU flushes it to 0
    torch.testing.assert_close(exp[finite], torch.exp(x[finite]), rtol=rtol, atol=0.0)
    torch.testing.assert_close(sig, torch.sigmoid(x), rtol=rtol, atol=1e-7)


def test_float64_close_enough_for_gradcheck():
    # Typically 5e-14 off; one run in about ten here saw 3e-9 near x = 700 (PyTorch's CPU exp or exp2).
    x = torch.linspace(-700.0, 700.0, 10001, dtype=torch.float64)
    torch.testing.assert_close(fastmath.exp(x), torch.exp(x), rtol=1e-8, atol=0.0)
    torch.testing.assert_close(fastmath.sigmoid(x), torch.sigmoid(x), rtol=1e-8, atol=1e-300)


def test_fp32_within_a_few_ulp_and_saturates_without_nan():
    x = _inputs()
    _check(x, fastmath.exp(x), fastmath.sigmoid(x), rtol=4e-6)  # x * log2(e) rounds at 2^-24 of up to 128
    sig = fastmath.sigmoid(EDGES)
    assert sig[0] == 0.0 and sig[-1] == 1.0 and not sig.isnan().any()


def _check_softplus(x: torch.Tensor, got: torch.Tensor) -> None:
    # log2(1 + u) loses 1 + u's rounding (2^-24 of ~1) against a result that is 6.7e-3 at x = -5, hence 2e-5
    # there; below -5 the series' first dropped term is u^3 / 4 < 1e-7 relative. Identity above 20.
    want = torch.nn.functional.softplus(x.double(), threshold=20.0)
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=0.0)
    assert torch.equal(got[x > 20.0], x[x > 20.0])


def test_softplus_matches_torch_in_fp64_and_fp32_with_the_threshold_and_the_small_x_series():
    x64 = torch.linspace(-60.0, 60.0, 24001, dtype=torch.float64)
    torch.testing.assert_close(fastmath.softplus(x64), torch.nn.functional.softplus(x64, threshold=20.0),
                               rtol=1e-7, atol=0.0)
    _check_softplus(_inputs(), fastmath.softplus(_inputs()))


# numpy, at x = -1e4 (exp2) and in the softplus series at x = 1e4 (multiply), which the threshold discards
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")
def test_through_the_triton_interpreter():
    x = _inputs()
    with execution_mode("triton"):
        exp, sig = _exp_and_sigmoid(x)
        soft = _softplus(x)
    _check(x, exp, sig, rtol=4e-6)
    _check_softplus(x, soft)


@pytest.mark.gpu
def test_mufu_approximations_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run with -m gpu on a GPU runner)")
    x = _inputs("cuda")
    exp, sig = _exp_and_sigmoid(x)
    # ex2.approx and rsqrt.approx: 2^-22 relative each, on top of the argument's rounding
    _check(x.cpu(), exp.cpu(), sig.cpu(), rtol=8e-6)
