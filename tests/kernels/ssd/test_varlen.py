"""Variable-length states: ``mamba_chunk_scan_combined(..., cu_seqlens=..., return_varlen_states=True)`` and its
kernel ``mamba2_kernels.ssd.chunk_state_varlen``, on CPU.

(a) the whole call against mamba-ssm's own varlen path (its Triton kernels in the interpreter): out, final_states
    and varlen_states; (b) against a sequential fp64 recurrence run on each sequence alone; (c) the Helion kernel
    in ref mode and in Triton's interpreter (blocks below every dimension) against the fp64 reference of
    ``mamba2_kernels.ssd.naive``; (d) the argument errors; and the gradients: out's are those of a call without
    return_varlen_states, and a gradient through varlen_states matches the fp64 reference's.
Sequences are 1, 2 and 4 per call, with boundaries inside chunks and on chunk edges (chunk 32), seq_idx derived
from cu_seqlens as Mamba2's callers do.
"""

from __future__ import annotations

import pytest
import torch

import mamba2_kernels
from mamba2_kernels import _mamba_ssm, registry
from mamba2_kernels._runtime import pinned_config
from mamba2_kernels.ssd import chunk_state_varlen, naive
from mamba2_kernels.testing import execution_mode

Q = 32
# (cu_seqlens, ngroups, initial_states)
CASES = {
    "1seq": ([0, 100], 2, True),
    "2seq-edge": ([0, 64, 130], 1, False),  # the boundary on a chunk edge
    "4seq": ([0, 20, 50, 96, 160], 2, True),  # inside chunks, and 96 on an edge
    "4seq-g1": ([0, 20, 50, 96, 160], 1, False),
    "2seq-short-first": ([0, 20, 96], 1, True),  # sequence 0 ends in chunk 0: mamba-ssm drops initial_states
}


def _problem(cu, g, init, h=4, p=16, n=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    L = cu[-1]
    cu_seqlens = torch.tensor(cu, dtype=torch.int32)
    lengths = cu_seqlens.diff()
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), lengths)[None].contiguous()
    args = {
        "x": torch.randn(1, L, h, p, generator=gen), "dt": torch.randn(1, L, h, generator=gen) * 0.5 - 2.0,
        "A": -torch.rand(h, generator=gen) * 2 - 0.5, "B": torch.randn(1, L, g, n, generator=gen),
        "C": torch.randn(1, L, g, n, generator=gen), "D": torch.randn(h, generator=gen),
        "dt_bias": torch.rand(h, generator=gen) - 1.0,
    }
    if init:
        args["initial_states"] = torch.randn(1, h, p, n, generator=gen)
    return args, {"chunk_size": Q, "seq_idx": seq_idx, "cu_seqlens": cu_seqlens, "dt_softplus": True}


def _ours(args, options, **flags):
    with execution_mode("ref"):
        return mamba2_kernels.mamba_chunk_scan_combined(**args, **options, **flags)


def _close(got, expected, atol=1e-4, rtol=1e-4):
    assert got.shape == expected.shape
    torch.testing.assert_close(got.double(), expected.double(), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------------
# (a) against mamba-ssm's varlen path


@pytest.mark.parametrize("case", list(CASES))
def test_matches_mamba_ssm(case):
    args, options = _problem(*CASES[case])
    flags = {"return_final_states": True, "return_varlen_states": True}
    out, final, varlen = _ours(args, options, **flags)
    theirs_fn = _mamba_ssm.resolve(f"{_mamba_ssm.SSD_COMBINED}:mamba_chunk_scan_combined")
    t_out, t_final, t_varlen = theirs_fn(**args, **options, **flags)
    assert varlen.shape == t_varlen.shape == (len(CASES[case][0]) - 1, 4, 16, 16)
    assert (out.dtype, final.dtype, varlen.dtype) == (t_out.dtype, t_final.dtype, t_varlen.dtype)
    _close(out, t_out)
    _close(final, t_final)
    _close(varlen, t_varlen)


def test_return_order_and_dtypes_follow_mamba_ssm():
    """out, varlen_states without return_final_states; varlen_states in C's dtype (the states passed in it)."""
    args, options = _problem([0, 40, 96], 2, False)
    out, varlen = _ours(args, options, return_varlen_states=True)
    assert out.shape == args["x"].shape and varlen.shape == (2, 4, 16, 16)
    half = {k: v.half() if k in ("x", "B", "C") else v for k, v in args.items()}
    _, final, varlen = _ours(half, options, return_final_states=True, return_varlen_states=True)
    assert final.dtype == torch.float32 and varlen.dtype == torch.float16


# ---------------------------------------------------------------------------------------------------
# (b) against a sequential fp64 recurrence over each sequence alone


@pytest.mark.parametrize("case", list(CASES))
def test_each_sequence_alone_in_fp64(case):
    cu, g, init = CASES[case]
    args, options = _problem(cu, g, init)
    out, varlen = _ours(args, options, return_varlen_states=True)
    f64 = {k: v.double() for k, v in args.items()}
    for s, (start, end) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        piece = {k: v[:, start:end] if k in ("x", "dt", "B", "C") else v for k, v in f64.items()}
        if s > 0:
            piece.pop("initial_states", None)
        y, state = naive.ssd_recurrent_ref(**piece, dt_softplus=True, return_final_states=True)
        _close(out[:, start:end], y)
        if "initial_states" in piece and end <= Q:
            # mamba-ssm 2.3.2.post1's varlen kernel takes no initial_states: they reach sequence 0 only through
            # the state entering its last chunk, so not when it ends in chunk 0 (documented in combined.py).
            piece.pop("initial_states")
            _, state = naive.ssd_recurrent_ref(**piece, dt_softplus=True, return_final_states=True)
        _close(varlen[s], state[0])


# ---------------------------------------------------------------------------------------------------
# (c) the kernel in ref mode and in the interpreter against the fp64 reference


def _kernel_inputs(cu, h=4, p=32, g=2, n=16, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    T = cu[-1]
    nchunks = -(-T // Q)
    dt = torch.rand(h, nchunks, Q, generator=gen) * 0.1
    dA_cumsum = torch.cumsum(dt * -(torch.rand(h, 1, 1, generator=gen) * 4 + 0.5), dim=-1)
    return (torch.randn(T, g, n, generator=gen).to(dtype), torch.randn(T, h, p, generator=gen).to(dtype), dt,
            dA_cumsum, torch.tensor(cu, dtype=torch.int32),
            torch.randn(nchunks, h, p, n, generator=gen).to(dtype))


KERNEL_CUS = {
    "1seq-ragged": [0, 100],
    "4seq": [0, 20, 50, 96, 160],
    "edges": [0, 32, 64, 96],
    "empty": [0, 0, 31, 31, 33, 90],  # empty sequences, at 0 and inside
}


@pytest.mark.parametrize("mode", ["ref", "triton"])
@pytest.mark.parametrize("cu", list(KERNEL_CUS))
def test_kernel_matches_fp64_reference(cu, mode):
    inputs = _kernel_inputs(KERNEL_CUS[cu])
    # blocks below every dimension (p 32, n 16, Q 32), so that the interpreter runs the tiling and masks
    config = {"block_sizes": [16, 8, 16], "num_warps": 4}
    with execution_mode(mode), pinned_config(chunk_state_varlen.chunk_state_varlen_kernel, config):
        ours = chunk_state_varlen.chunk_state_varlen(*inputs)
    ref = naive.chunk_state_varlen(*(t.double() if t.is_floating_point() else t for t in inputs))
    assert ours.dtype == torch.float32
    _close(ours, ref, atol=1e-5, rtol=1e-5)
    if cu == "empty":
        assert not ours[[0, 2]].any()


def test_registry_entry_runs_the_kernel(smoke_shape):
    """The registry's inputs (the smoke batch packed, cut inside a chunk) through the Helion entry."""
    entry = registry.get("chunk_state_varlen")
    inputs = entry.inputs(smoke_shape, 0)
    assert inputs["cu_seqlens"].tolist() == [0, 47, 96]
    with execution_mode("ref"):
        ours = entry.run_helion(inputs)
    _close(ours["varlen_states"], entry.run_reference(inputs)["varlen_states"], atol=1e-5, rtol=1e-5)


def test_kernel_fp16_in_interpreter_matches_mamba_ssm():
    inputs = _kernel_inputs(KERNEL_CUS["4seq"], dtype=torch.float16)
    with execution_mode("triton"):
        ours = chunk_state_varlen.chunk_state_varlen(*inputs)
    theirs = _mamba_ssm.resolve(f"{_mamba_ssm.SSD_CHUNK_STATE}:chunk_state_varlen")(*inputs)
    assert ours.dtype == theirs.dtype == torch.float16
    _close(ours, theirs, atol=2e-3, rtol=2e-3)


# ---------------------------------------------------------------------------------------------------
# (d) errors


def _call(args, options, **changes):
    return mamba2_kernels.mamba_chunk_scan_combined(**args, **{**options, "return_varlen_states": True, **changes})


@pytest.mark.parametrize(("cu_seqlens", "message"), [
    (torch.tensor([[0, 40, 96]], dtype=torch.int32), "cu_seqlens: expected a 1-D integer tensor"),
    (torch.tensor([0.0, 40.0, 96.0]), "cu_seqlens: expected a 1-D integer tensor"),
    ([0, 40, 96], "cu_seqlens: expected a 1-D integer tensor"),
    (torch.tensor([1, 40, 96], dtype=torch.int32), "cu_seqlens: expected to start at 0, got 1"),
    (torch.tensor([0, 50, 40, 96], dtype=torch.int32), "cu_seqlens: expected non-decreasing"),
    (torch.tensor([0, 40, 95], dtype=torch.int32), r"cu_seqlens: expected to end at seqlen \(96\), got 95"),
])
def test_bad_cu_seqlens_are_named(cu_seqlens, message):
    args, options = _problem([0, 40, 96], 1, False)
    with pytest.raises(ValueError, match=message):
        _call(args, options, cu_seqlens=cu_seqlens)


def test_varlen_states_need_batch_one_and_cu_seqlens():
    args, options = _problem([0, 40, 96], 1, False)
    with pytest.raises(ValueError, match="return_varlen_states: cu_seqlens must be provided"):
        _call(args, options, cu_seqlens=None)
    two = {k: torch.cat([v, v]) if k in ("x", "dt", "B", "C") else v for k, v in args.items()}
    with pytest.raises(ValueError, match="cu_seqlens: .*only supported if batch dimension is 1, got batch 2"):
        _call(two, {**options, "seq_idx": torch.cat([options["seq_idx"]] * 2)})


def test_cu_seqlens_alone_is_ignored_as_in_mamba_ssm():
    args, options = _problem([0, 40, 96], 1, False)
    plain = _ours(args, {**options, "cu_seqlens": None})
    ignored = _ours(args, {**options, "cu_seqlens": torch.tensor([5, 3])})  # never read without the flag
    assert torch.equal(plain, ignored)


# ---------------------------------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("final", [False, True])
def test_gradients_of_out_are_unchanged_by_return_varlen_states(final):
    args, options = _problem([0, 20, 50, 96, 160], 2, True)
    upstream = torch.randn(args["x"].shape, generator=torch.Generator().manual_seed(9))
    dfinal = torch.randn(args["initial_states"].shape, generator=torch.Generator().manual_seed(10))
    grads = []
    for varlen in (False, True):
        leaves = {k: v.clone().requires_grad_(True) for k, v in args.items()}
        result = _ours(leaves, options, return_final_states=final, return_varlen_states=varlen)
        result = result if isinstance(result, tuple) else (result,)
        loss = (result[0] * upstream).sum() + ((result[1] * dfinal).sum() if final else 0.0)
        with execution_mode("ref"):
            loss.backward()
        grads.append({k: v.grad for k, v in leaves.items()})
    assert set(grads[0]) == set(grads[1])
    for name, grad in grads[0].items():
        assert grad is not None and torch.isfinite(grad).all(), name
        assert torch.equal(grad, grads[1][name]), name


@pytest.mark.parametrize("case", ["4seq", "2seq-edge", "2seq-short-first"])
def test_gradients_through_varlen_states_match_the_fp64_reference(case):
    """Every input's gradient when the varlen states carry one (mamba-ssm has no such backward), with out's and
    final_states' together, against autograd through the fp64 composition of the stage references: sequences
    ending inside chunks and on a chunk edge, and a first sequence ending in chunk 0 (initial_states do not
    reach its varlen state)."""
    cu, g, init = CASES[case]
    args, options = _problem(cu, g, init)
    gen = torch.Generator().manual_seed(11)
    dout = torch.randn(args["x"].shape, generator=gen)
    dvarlen = torch.randn(len(cu) - 1, *args["x"].shape[2:], args["B"].shape[-1], generator=gen)
    dfinal = torch.randn(dvarlen.shape[1:], generator=gen)[None]
    grads = []
    both = {"return_final_states": True, "return_varlen_states": True}
    runs = ((lambda leaves: _ours(leaves, options, **both), lambda t: t),
            (lambda leaves: naive.ssd_chunked_ref(**leaves, **options, **both), torch.Tensor.double))
    for run, cast in runs:
        leaves = {k: cast(v).detach().requires_grad_(True) for k, v in args.items()}
        out, final, varlen = run(leaves)
        loss = (out * cast(dout)).sum() + (varlen * cast(dvarlen)).sum() + (final * cast(dfinal)).sum()
        with execution_mode("ref"):
            loss.backward()
        grads.append({k: v.grad for k, v in leaves.items()})
    for name, expected in grads[1].items():
        scale = expected.abs().max().item()
        _close(grads[0][name], expected, atol=2e-4 * scale, rtol=2e-4)

