"""Output buffers handed to the SSD backward: the stages' ``dz=``, ``dx=``, ``out=`` and ``ddt=`` and
``ssd_backward``'s dx, ddt, dB, dC, dz (mamba-ssm's ``_mamba_chunk_scan_combined_bwd``), as the layer hands
them: strided column slices of one wider buffer. Each is filled by the kernel with the values of the call
without it, nothing beside it is written, and it is the tensor returned; a wrong one is refused by name.
CPU, Helion ref mode (the layer's Triton-interpreter test runs the same writes in generated code).
"""

from __future__ import annotations

import pytest
import torch

from mamba2_kernels import registry, suites
from mamba2_kernels.ssd import bmm_chunk_bwd, chunk_cumsum_bwd, chunk_scan_bwd, chunk_scan_chunk_state_bwd
from mamba2_kernels.ssd.combined import ssd_backward
from mamba2_kernels.testing import column_slice, execution_mode

SHAPE = suites.load().shape("smoke").replace(seqlen=80, batch=2)  # b2 L80 h4 p16 g2 n16 Q32: ragged last chunk
b, L, h, p, g, n = SHAPE.batch, SHAPE.seqlen, SHAPE.nheads, SHAPE.headdim, SHAPE.ngroups, SHAPE.dstate


def _inputs(name):
    return registry.get(name).inputs(SHAPE, 0)


def _dz(dz=None):
    inp = _inputs("chunk_scan_bwd_dz")
    return chunk_scan_bwd.chunk_scan_bwd_dz(inp["x"], inp["z"], inp["out_x"], inp["dout"], SHAPE.chunk_size,
                                            has_ddAcs=True, D=inp["D"], dz=dz)[0]


def _dx(dx=None):
    inp = _inputs("chunk_scan_chunk_state_bwd_dx")
    return chunk_scan_chunk_state_bwd.chunk_scan_chunk_state_bwd_dx(
        inp["x"], inp["dt"], inp["dA_cumsum"], inp["B"], inp["cb"], inp["dout"], inp["dstates"], D=inp["D"],
        dx=dx)[0]


def _db(out=None, groups=True):
    inp = _inputs("bmm_chunk_bwd")
    a, dcb, residual = inp["C"], inp["dcb"], inp["residual"]
    if not groups:
        a, dcb, residual = a[:, :, 0], dcb[:, :, 0], residual[:, :, 0]
    return bmm_chunk_bwd.bmm_chunk_bwd(a, dcb, residual=residual, out=out)


def _ddt(ddt=None):
    inp = _inputs("chunk_cumsum_bwd")
    return chunk_cumsum_bwd.chunk_cumsum_bwd(inp["ddA"], inp["ddt_out"], inp["dt_raw"], inp["A"], inp["dt_bias"],
                                            dt_softplus=True, ddt=ddt)[0]


# label: (run, the output argument, its shape, its dtype, a dtype it refuses)
STAGES = {
    "chunk_scan_bwd_dz": (_dz, "dz", (b, L, h, p), torch.float32, torch.float64),
    "chunk_scan_chunk_state_bwd_dx": (_dx, "dx", (b, L, h, p), torch.float32, torch.float64),
    "bmm_chunk_bwd": (_db, "out", (b, L, g, n), torch.float32, torch.int32),
    "bmm_chunk_bwd-fp16_out": (_db, "out", (b, L, g, n), torch.float16, torch.int32),  # cast on store
    "bmm_chunk_bwd-no_groups": (lambda out=None: _db(out, groups=False), "out", (b, L, n), torch.float32,
                                torch.int32),
    "chunk_cumsum_bwd": (_ddt, "ddt", (b, L, h), torch.float32, torch.float64),
}


def _assert_filled(got, given, buffer, want):
    assert got is given
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.isnan(buffer).sum() == buffer.numel() - given.numel(), "a write beside the given slice"


@pytest.mark.parametrize("label", list(STAGES))
def test_stage_fills_the_given_slice(label):
    run, _, shape, dtype, _ = STAGES[label]
    given, buffer = column_slice(shape, dtype)
    with execution_mode("ref"):
        want = run()
        got = run(given)
    _assert_filled(got, given, buffer, want.to(dtype))


@pytest.mark.parametrize("wrong", ["shape", "dtype"])
@pytest.mark.parametrize("label", list(STAGES))
def test_stage_refuses_a_wrong_buffer(label, wrong):
    run, name, shape, dtype, refused = STAGES[label]
    given = torch.empty(*shape[:-1], shape[-1] + 1, dtype=dtype) if wrong == "shape" else torch.empty(shape,
                                                                                                       dtype=refused)
    with execution_mode("ref"), pytest.raises(ValueError, match=f"{name}: expected"):
        run(given)


def _ssd_problem(with_z):
    gen = torch.Generator().manual_seed(3)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    args = (randn(b, L, h, p, scale=0.1), randn(b, L, h, p), randn(b, L, h, scale=0.5) - 3.0,
            -torch.rand(h, generator=gen) * 4 - 0.5, randn(b, L, g, n), randn(b, L, g, n), randn(b, L, h, p))
    kwargs = {"D": randn(h), "dt_bias": torch.rand(h, generator=gen) - 2.0, "dt_softplus": True,
              "z": randn(b, L, h, p) if with_z else None}
    return args, kwargs  # args: dout, x, dt, A, B, C, out


def _layer_like_slices(with_z):
    """dz, dx, dB, dC, ddt as views of one (b, L, width) buffer, in the order of the layer's zxbcdt."""
    widths = [h * p, h * p, g * n, g * n, h]
    inner = [(h, p), (h, p), (g, n), (g, n), (h,)]
    _, buffer = column_slice((b, L, sum(widths)))
    views = [v.unflatten(-1, s) for v, s in zip(buffer[..., 3:-5].split(widths, dim=-1), inner, strict=True)]
    dz, dx, dB, dC, ddt = views
    return {"dx": dx, "ddt": ddt, "dB": dB, "dC": dC, **({"dz": dz} if with_z else {})}, buffer


@pytest.mark.parametrize("with_z", [False, True], ids=["no_z", "z"])
def test_ssd_backward_fills_the_given_slices(with_z):
    args, kwargs = _ssd_problem(with_z)
    given, buffer = _layer_like_slices(with_z)
    with execution_mode("ref"):
        want = ssd_backward(*args, SHAPE.chunk_size, **kwargs)
        got = ssd_backward(*args, SHAPE.chunk_size, **kwargs, **given)
    positions = {"dx": 0, "ddt": 1, "dB": 3, "dC": 4, "dz": 6}
    for name, tensor in given.items():
        assert got[positions[name]] is tensor, name
    for i, (mine, ref) in enumerate(zip(got, want, strict=True)):
        assert (mine is None) == (ref is None), i
        if ref is not None:
            torch.testing.assert_close(mine, ref, rtol=0, atol=0, msg=lambda m, i=i: f"output {i}: {m}")
    if with_z:  # the five slices tile the buffer between its paddings
        assert torch.isnan(buffer).sum() == buffer.numel() - buffer[..., 3:-5].numel()


@pytest.mark.parametrize(("name", "given", "message"), [
    ("dx", torch.empty(b, L, h, p + 1), r"dx: expected a torch.float32 tensor of shape \(2, 80, 4, 16\)"),
    ("ddt", torch.empty(b, L, h, dtype=torch.float64), r"ddt: expected a torch.float32 tensor of shape \(2, 80, 4\)"),
    ("dB", torch.empty(b, L, g * n), r"dB: expected a torch.float32 tensor of shape \(2, 80, 2, 16\)"),
    ("dC", torch.empty(b, L, g, n, dtype=torch.float16), "dC: expected a torch.float32"),
    ("dz", torch.empty(b, L, h, p), "dz: given without z"),
])
def test_ssd_backward_refuses_a_wrong_buffer(name, given, message):
    args, kwargs = _ssd_problem(with_z=False)
    with execution_mode("ref"), pytest.raises(ValueError, match=message):
        ssd_backward(*args, SHAPE.chunk_size, **kwargs, **{name: given})
