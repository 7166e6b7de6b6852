"""Tests of the Helion causal conv1d (mamba2_kernels/conv/causal_conv1d.py) against the fp64 references of
mamba2_kernels/conv/naive.py, in Helion's ref mode and in the Triton interpreter (with block sizes smaller than
the dimensions), plus gradcheck of ``causal_conv1d_fn`` in fp64."""

from __future__ import annotations

import itertools

import pytest
import torch

from mamba2_kernels import testing
from mamba2_kernels.conv import causal_conv1d as C
from mamba2_kernels.conv import naive

B, D, L = 2, 12, 37  # odd seqlen, not a multiple of any block size
COMBOS = list(itertools.product([2, 3, 4], [False, True], [None, "silu"]))
IDS = [f"w{w}-b{int(b)}-{a}" for w, b, a in COMBOS]
# Every pair of two options' values together, in 6 of the 12 combinations: in Triton's interpreter each one
# compiles kernels of its own, seconds each (ref mode runs all 12).
PAIRWISE = [(2, False, None), (2, True, "silu"), (3, False, "silu"), (3, True, None), (4, False, None),
            (4, True, "silu")]


def _seq_idx(seqlen=L):
    return torch.tensor([[0] * 10 + [1] * 20 + [2] * (seqlen - 30), [0] * 3 + [1] * (seqlen - 3)],
                        dtype=torch.int32)


def _inputs(width, has_bias, dtype=torch.float32, seed=0, shape=(B, D, L)):
    g = torch.Generator().manual_seed(seed)

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(dtype)

    return dict(x=rnd(*shape), weight=rnd(shape[1], width, scale=0.5),
                bias=rnd(shape[1], scale=0.1) if has_bias else None, dout=rnd(*shape, scale=0.5))


def _f64(t):
    return t.double() if t is not None else None


def _check(inp, seq_idx, act, atol, rtol):
    out = C.causal_conv1d_fwd(inp["x"], inp["weight"], inp["bias"], seq_idx, act)
    grads = C.causal_conv1d_bwd(inp["x"], inp["weight"], inp["bias"], inp["dout"], seq_idx, act)
    out_r = naive.causal_conv1d_fwd(_f64(inp["x"]), _f64(inp["weight"]), _f64(inp["bias"]), seq_idx, act)
    grads_r = naive.causal_conv1d_bwd(_f64(inp["x"]), _f64(inp["weight"]), _f64(inp["bias"]), _f64(inp["dout"]),
                                      seq_idx, act)
    assert out.dtype == inp["x"].dtype
    torch.testing.assert_close(out.double(), out_r, atol=atol, rtol=rtol)
    for name, a, b in zip(("dx", "dweight", "dbias"), grads, grads_r, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == inp["x"].dtype
            torch.testing.assert_close(a.double(), b, atol=atol, rtol=rtol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("seq", [False, True], ids=["noseq", "seq_idx"])
@pytest.mark.parametrize("width,has_bias,act", COMBOS, ids=IDS)
def test_ref_mode_fp32(width, has_bias, act, seq):
    with testing.execution_mode("ref"):
        _check(_inputs(width, has_bias), _seq_idx() if seq else None, act, 2e-5, 2e-5)


@pytest.mark.parametrize("width,has_bias,act", PAIRWISE, ids=[IDS[COMBOS.index(c)] for c in PAIRWISE])
def test_interpreter_fp32(width, has_bias, act):
    # Helion's default configs here: 16 channels x 16 steps (fwd), 16 channels x spans of 16 steps (bwd) < L = 37.
    with testing.execution_mode("triton"):
        _check(_inputs(width, has_bias, seed=width), None, act, 2e-5, 2e-5)


def test_interpreter_seq_idx_fp32():
    with testing.execution_mode("triton"):
        _check(_inputs(4, True, seed=9), _seq_idx(), "silu", 2e-5, 2e-5)


def test_interpreter_explicit_small_blocks_fp16():
    inp = _inputs(4, True, torch.float16, seed=4)
    out_r = naive.causal_conv1d_fwd(_f64(inp["x"]), _f64(inp["weight"]), _f64(inp["bias"]), None, "silu")
    grads_r = naive.causal_conv1d_bwd(_f64(inp["x"]), _f64(inp["weight"]), _f64(inp["bias"]), _f64(inp["dout"]),
                                      None, "silu")
    with testing.execution_mode("triton"):
        fwd = C.causal_conv1d_fwd_kernel.helion_kernel({"block_sizes": [1, 4, 8], "num_warps": 2}, "compiled")
        out = fwd(inp["x"], inp["weight"], inp["bias"], None, torch.empty_like(inp["x"]), True)
        # spans of 16 steps (the last one ragged), 4 channels per program
        bwd = C.causal_conv1d_bwd_kernel.helion_kernel({"block_sizes": [16, 4], "num_warps": 2}, "compiled")
        dx, dw_part, db_part = bwd(inp["x"], inp["weight"], inp["bias"], inp["dout"], None,
                                   torch.empty_like(inp["x"]), True)
    assert dw_part.shape[0] == B * 3  # one partial per (batch, span of 16)
    dw, db = dw_part.sum(0).t(), db_part.sum(0)
    for a, b in zip((out, dx, dw, db), (out_r, *grads_r), strict=True):
        torch.testing.assert_close(a.double(), b, atol=1e-2, rtol=1e-2)


def _channels_last_view(t):
    """(b, d, L) values in Mamba2's layout: a transposed view into wider (b, L, d + 5) memory."""
    wide = torch.zeros(t.shape[0], t.shape[2], t.shape[1] + 5, dtype=t.dtype)
    wide[..., 2:2 + t.shape[1]] = t.transpose(1, 2)
    return wide[..., 2:2 + t.shape[1]].transpose(1, 2)


@pytest.mark.parametrize("mode", ["ref", "triton"])
def test_channels_last_views_are_read_in_place_and_outputs_keep_the_layout(mode):
    inp = _inputs(4, True, seed=11)
    seq = _seq_idx()
    x_view, dout_view = _channels_last_view(inp["x"]), _channels_last_view(inp["dout"])
    assert x_view.stride(1) == 1 and not x_view.is_contiguous()
    with testing.execution_mode(mode):
        out = C.causal_conv1d_fwd(x_view, inp["weight"], inp["bias"], seq, "silu")
        dx, dw, db = C.causal_conv1d_bwd(x_view, inp["weight"], inp["bias"], dout_view, seq, "silu")
        out_c = C.causal_conv1d_fwd(inp["x"], inp["weight"], inp["bias"], seq, "silu")
    assert out.stride(1) == 1 and dx.stride(1) == 1  # channels last, like x
    assert out_c.stride(2) == 1
    out_r = naive.causal_conv1d_fwd(_f64(inp["x"]), _f64(inp["weight"]), _f64(inp["bias"]), seq, "silu")
    grads_r = naive.causal_conv1d_bwd(_f64(inp["x"]), _f64(inp["weight"]), _f64(inp["bias"]), _f64(inp["dout"]),
                                      seq, "silu")
    for a, b in zip((out, out_c, dx, dw, db), (out_r, out_r, *grads_r), strict=True):
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=2e-5)


def test_backward_writes_dx_into_a_given_slice_and_rejects_a_bad_one():
    """The layer hands the backward a channels-last slice of its input gradient; dx lands there, in place."""
    inp = _inputs(4, True, seed=12)
    wide = torch.full((B, L, D + 5), 7.0)
    slot = wide[..., 2:2 + D].transpose(1, 2)
    with testing.execution_mode("ref"):
        dx, dw, db = C.causal_conv1d_bwd(inp["x"], inp["weight"], inp["bias"], inp["dout"], None, "silu", dx=slot)
        with pytest.raises(ValueError, match="dx: expected"):
            C.causal_conv1d_bwd(inp["x"], inp["weight"], inp["bias"], inp["dout"], None, "silu",
                                dx=torch.empty(B, D, L))  # stride 1 over time, not over channels
    grads_r = naive.causal_conv1d_bwd(_f64(inp["x"]), _f64(inp["weight"]), _f64(inp["bias"]), _f64(inp["dout"]),
                                      None, "silu")
    assert dx.data_ptr() == slot.data_ptr()
    torch.testing.assert_close(slot.double(), grads_r[0], atol=2e-5, rtol=2e-5)
    assert (wide[..., :2] == 7.0).all() and (wide[..., 2 + D:] == 7.0).all()  # nothing outside the slice


def test_layout_is_part_of_the_shape_key():
    inp = _inputs(4, True)
    x_view = _channels_last_view(inp["x"])
    dense, view = (str(C._fwd_key(x, inp["weight"], inp["bias"], None, x, True)) for x in (inp["x"], x_view))
    assert "channels_last=0" in dense and view == dense.replace("channels_last=0", "channels_last=1")


def test_gradcheck_causal_conv1d_fn_fp64():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 3, 9, generator=g, dtype=torch.float64, requires_grad=True)
    w = (0.5 * torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_()
    b = (0.1 * torch.randn(3, generator=g, dtype=torch.float64)).requires_grad_()
    seq = torch.tensor([[0] * 4 + [1] * 5], dtype=torch.int32)
    with testing.execution_mode("ref"):
        assert torch.autograd.gradcheck(lambda x, w, b: C.causal_conv1d_fn(x, w, b, activation="silu"), (x, w, b))
        assert torch.autograd.gradcheck(lambda x, w: C.causal_conv1d_fn(x, w, None, seq_idx=seq), (x, w))


def test_rejects_bad_arguments():
    inp = _inputs(4, False)
    with pytest.raises(ValueError, match="activation"):
        C.causal_conv1d_fwd(inp["x"], inp["weight"], activation="gelu")
    with pytest.raises(ValueError, match="width"):
        C.causal_conv1d_fwd(inp["x"], torch.zeros(D, 5))


@pytest.mark.gpu
@pytest.mark.parametrize("act", [None, "silu"])
def test_gpu_bf16_against_reference(act):
    inp = {k: v.cuda() for k, v in _inputs(4, True, torch.bfloat16, 5, shape=(2, 256, 1001)).items()}
    _check(inp, None, act, 5e-2, 5e-2)
