"""The public functions' torch.library operators, checked by torch's own ``opcheck``: the schema, the fake
functions against the real outputs (shapes, dtypes, strides), the autograd registration, and AOTAutograd with
dynamic shapes, on tiny CPU problems in Helion's reference mode."""

from __future__ import annotations

import pytest
import torch

import mamba2_kernels  # noqa: F401  (the operators are registered when their modules load)
from mamba2_kernels.conv import causal_conv1d  # noqa: F401
from mamba2_kernels.norm import rmsnorm  # noqa: F401
from mamba2_kernels.ssd import combined  # noqa: F401
from mamba2_kernels.testing import execution_mode

CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
INF = float("inf")


def _leaves(*args):
    return tuple(a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def _ssd_args(z: bool, varlen: bool):
    g = torch.Generator().manual_seed(0)
    b, L, h, p, ng, n = 1, 80, 4, 16, 2, 16
    x, zz = torch.randn(b, L, h, p, generator=g), torch.randn(b, L, h, p, generator=g)
    B, C = torch.randn(b, L, ng, n, generator=g), torch.randn(b, L, ng, n, generator=g)
    dt, A = torch.rand(b, L, h, generator=g), -torch.rand(h, generator=g)
    if varlen:  # no z, D per head, dt_bias, cu_seqlens: the other optional arguments
        return _leaves(x, dt, A, B, C, 32, torch.randn(h, generator=g), None, torch.rand(h, generator=g), None, None,
                       torch.tensor([0, 30, 80]), False, [0.0, INF], False, torch.float16)
    seq_idx = torch.tensor([[0] * 30 + [1] * 50], dtype=torch.int32)
    return _leaves(x, dt, A, B, C, 32, torch.randn(h, p, generator=g), zz if z else None, None,
                   torch.randn(b, h, p, n, generator=g), seq_idx, None, True, [0.0, 5.0], True, None)


@pytest.mark.parametrize(("z", "varlen"), [(True, False), (False, True)], ids=["z-init-seq_idx", "varlen"])
def test_ssd_operator(z, varlen):
    # opcheck's AOT test takes a gradient through every output: varlen_states' too.
    with execution_mode("ref"):
        torch.library.opcheck(torch.ops.mamba2_kernels.ssd_combined_fwd.default, _ssd_args(z, varlen),
                              test_utils=CHECKS)


def _split_views(layout: str, b: int, L: int, widths: list[int], g: torch.Generator) -> list[torch.Tensor]:
    """Tensors of the given last-dim widths as slices of one buffer, as a layer hands them in: ``mamba2`` splits a
    (b, L, sum) buffer (Mamba2's xBC); ``permuted`` a transposed (b, sum, L) buffer, as the conv's output is when
    its input was contiguous (the context-parallel halo's), so that each slice's strides are permuted."""
    if layout == "mamba2":
        buffer = torch.randn(b, L, sum(widths) + 3, generator=g)
    else:
        buffer = torch.randn(b, sum(widths) + 3, L + 3, generator=g)[..., 3:].transpose(1, 2)
    return list(torch.split(buffer, [*widths, 3], dim=-1)[:-1])


@pytest.mark.parametrize("layout", ["mamba2", "permuted"])
def test_ssd_operators_outputs_are_contiguous_whatever_the_inputs_layout(layout):
    """The fake functions promise contiguous outputs, as mamba-ssm's kernels allocate them; an output that
    followed a permuted input's layout instead (``empty_like``) would be read by the compiled graph with the
    promised strides."""
    g = torch.Generator().manual_seed(3)
    b, L, h, p, ng, n = 2, 48, 4, 8, 2, 8
    x, B, C, z, dout = _split_views(layout, b, L, [h * p, ng * n, ng * n, h * p, h * p], g)
    x, z, dout = (t.unflatten(-1, (h, p)) for t in (x, z, dout))
    B, C = (t.unflatten(-1, (ng, n)) for t in (B, C))
    dt = _split_views(layout, b, L, [h], g)[0]
    A, D = -torch.rand(h, generator=g), torch.randn(h, p, generator=g)
    with execution_mode("ref"):
        torch.library.opcheck(torch.ops.mamba2_kernels.ssd_combined_fwd.default,
                              _leaves(x, dt, A, B, C, 16, D, z, None, None, None, None, True, [0.0, INF], False,
                                      None), test_utils=CHECKS)
        out = torch.randn(b, L, h, p, generator=g)
        torch.library.opcheck(torch.ops.mamba2_kernels.ssd_combined_bwd.default,
                              (dout, x, dt, A, B, C, out, 16, D, z, None, None, None, None, None, None, True,
                               [0.0, INF], None), test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize(("bias", "z"), [(False, True), (True, False)], ids=["z", "bias"])
def test_gated_rmsnorm_operator(bias, z):
    g = torch.Generator().manual_seed(1)
    args = _leaves(torch.randn(20, 32, generator=g), torch.randn(32, generator=g),
                   torch.randn(32, generator=g) if bias else None, torch.randn(20, 32, generator=g) if z else None,
                   1e-6, 16 if z else None, not z)
    with execution_mode("ref"):
        torch.library.opcheck(torch.ops.mamba2_kernels.gated_rmsnorm_fwd.default, args, test_utils=CHECKS)


@pytest.mark.parametrize("layout", ["channels-last", "contiguous", "neither"])
def test_causal_conv1d_operator(layout):
    """``neither``: no dimension of stride 1, which the kernels read through a contiguous copy."""
    g = torch.Generator().manual_seed(2)
    channels_last = layout == "channels-last"
    x = {"channels-last": lambda: torch.randn(2, 40, 24, generator=g).transpose(1, 2),
         "contiguous": lambda: torch.randn(2, 24, 40, generator=g),
         "neither": lambda: torch.randn(2, 24, 80, generator=g)[..., ::2]}[layout]()
    seq_idx = None if channels_last else torch.zeros(2, 40, dtype=torch.int32)
    args = _leaves(x, torch.randn(24, 4, generator=g), torch.randn(24, generator=g) if channels_last else None,
                   seq_idx, "silu" if channels_last else None)
    with execution_mode("ref"):
        torch.library.opcheck(torch.ops.mamba2_kernels.causal_conv1d_fwd.default, args, test_utils=CHECKS)
