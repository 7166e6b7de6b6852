"""``mamba2_kernels.mamba_chunk_scan_combined``: the forward drop-in on CPU (Helion ref mode) against the fp64
reference, and its argument checks."""

from __future__ import annotations

import pytest
import torch

import mamba2_kernels
from mamba2_kernels.ssd import naive
from mamba2_kernels.testing import execution_mode

from .checks import spy_states_dtypes


def _problem(b=2, L=80, h=4, p=16, g=2, n=16, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    return {
        "x": randn(b, L, h, p), "dt": randn(b, L, h, scale=0.5) - 3.0,
        "A": -torch.rand(h, generator=gen) * 4 - 0.5, "B": randn(b, L, g, n), "C": randn(b, L, g, n),
    }


OPTIONS = [
    {},
    {"D": "head", "dt_bias": True, "dt_softplus": True},
    {"D": "dim", "z": True, "dt_limit": (0.01, 0.5), "dt_bias": True, "dt_softplus": True},
    {"initial_states": True, "return_final_states": True, "D": "head"},
]


def _arguments(base, options, gen_seed=1):
    gen = torch.Generator().manual_seed(gen_seed)
    b, L, h, p = base["x"].shape
    n = base["B"].shape[-1]
    kwargs = {}
    if options.get("D") == "head":
        kwargs["D"] = torch.randn(h, generator=gen)
    elif options.get("D") == "dim":
        kwargs["D"] = torch.randn(h, p, generator=gen)
    if options.get("z"):
        kwargs["z"] = torch.randn(b, L, h, p, generator=gen)
    if options.get("dt_bias"):
        kwargs["dt_bias"] = torch.rand(h, generator=gen) - 2.0
    if options.get("initial_states"):
        kwargs["initial_states"] = torch.randn(b, h, p, n, generator=gen)
    for key in ("dt_softplus", "dt_limit", "return_final_states"):
        if key in options:
            kwargs[key] = options[key]
    return kwargs


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(sorted(o)) or "plain")
@pytest.mark.parametrize(("L", "g"), [(80, 2), (64, 1), (64, 4)])
def test_forward_matches_fp64_reference(options, L, g):
    base = _problem(L=L, g=g)
    kwargs = _arguments(base, options)
    with execution_mode("ref"):
        ours = mamba2_kernels.mamba_chunk_scan_combined(**base, chunk_size=32, **kwargs)
    ref = naive.ssd_chunked_ref(**{k: v.double() for k, v in base.items()}, chunk_size=32,
                                **{k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
    ours, ref = (ours, ref) if isinstance(ours, tuple) else ((ours,), (ref,))
    for mine, theirs in zip(ours, ref, strict=True):
        assert mine.dtype in (torch.float32,) and torch.isfinite(mine).all()
        torch.testing.assert_close(mine.double(), theirs, atol=1e-4, rtol=1e-4)


def test_varlen_arguments_are_checked_by_name():
    """cu_seqlens and return_varlen_states work (tests/kernels/ssd/test_varlen.py); here only their errors at
    batch 2."""
    base = _problem()
    with pytest.raises(ValueError, match="return_varlen_states: cu_seqlens must be provided"):
        mamba2_kernels.mamba_chunk_scan_combined(**base, chunk_size=32, return_varlen_states=True)
    with pytest.raises(ValueError, match="cu_seqlens: .*batch dimension is 1"):
        mamba2_kernels.mamba_chunk_scan_combined(**base, chunk_size=32, cu_seqlens=torch.tensor([0, 80]),
                                          return_varlen_states=True)


def test_backward_runs():
    base = _problem(b=1, L=32)
    base["x"].requires_grad_(True)
    with execution_mode("ref"):
        out = mamba2_kernels.mamba_chunk_scan_combined(**base, chunk_size=32)
        out.sum().backward()
    assert base["x"].grad is not None and torch.isfinite(base["x"].grad).all()


@pytest.mark.parametrize(("change", "message"), [
    ({"dt": torch.zeros(2, 80, 3)}, r"dt: expected \(2, 80, 4\)"),
    ({"A": torch.zeros(3)}, r"A: expected \(4,\)"),
    ({"C": torch.zeros(2, 80, 2, 8)}, "C: expected the shape of B"),
    ({"B": torch.zeros(2, 80, 3, 16), "C": torch.zeros(2, 80, 3, 16)}, r"ngroups \(3\) must divide nheads"),
    ({"D": torch.zeros(5)}, "D: expected"),
    ({"chunk_size": 0}, "chunk_size: expected a positive int"),
    ({"initial_states": torch.zeros(2, 4, 16, 8)}, "initial_states: expected"),
    ({"seq_idx": torch.zeros(2, 81, dtype=torch.int32)}, "seq_idx: expected"),
    ({"dt_limit": (1.0, 0.0)}, "dt_limit: expected"),
    ({"x": torch.zeros(2, 80, 4, 16, dtype=torch.float64)}, "x: expected float16, bfloat16 or float32, got "
     "torch.float64"),
    ({"x": torch.zeros(2, 80, 4, 16, dtype=torch.int32)}, "x: expected float16, bfloat16 or float32, got torch.int32"),
    ({"x": torch.zeros(2, 80, 4, 16, device="meta")}, "x: on the meta device"),
    ({"x": torch.zeros(2, 0, 4, 16), "dt": torch.zeros(2, 0, 4), "B": torch.zeros(2, 0, 2, 8),
      "C": torch.zeros(2, 0, 2, 8)}, "x: expected no empty dimension"),
    ({"dt": torch.zeros(2, 80, 4, dtype=torch.int64)}, "dt: expected a floating tensor, got torch.int64"),
    ({"seq_idx": torch.zeros(2, 80)}, "seq_idx: expected an integer tensor"),
    ({"seq_idx": torch.arange(80, 0, -1, dtype=torch.int32).expand(2, 80)}, "seq_idx: expected non-decreasing"),
])
def test_bad_arguments_are_named(change, message):
    arguments = {**_problem(), "chunk_size": 32, **change}
    with pytest.raises(ValueError, match=message):
        mamba2_kernels.mamba_chunk_scan_combined(**arguments)


def test_a_chunk_size_not_a_power_of_two_is_refused_before_any_kernel_runs():
    """mamba-ssm takes any chunk length; ours tiles the chunk, so the call says so up front, not from a kernel
    deep in the forward after others ran."""
    from mamba2_kernels._runtime import capture_launches

    with capture_launches() as launches, execution_mode("ref"), pytest.raises(
            NotImplementedError, match="chunk_size: only powers of two are supported, got 48"):
        mamba2_kernels.mamba_chunk_scan_combined(**_problem(), chunk_size=48)
    assert launches == []


def test_the_whole_calls_precision_judges_dz_and_dinitial_states(monkeypatch):
    """The bench's precision of the whole call (forward + backward) covers the gradients of z and of the
    initial states where the shape's call gives them, like the other gradients: a wrong dz fails it."""
    from mamba2_guard.bench.run import precision_of
    from mamba2_kernels import registry, suites
    from mamba2_kernels.ssd import combined

    entry = registry.get("ssd_combined_fwd_bwd")
    shape = suites.load().shape("smoke").replace(z=True, initial_states=True)
    with execution_mode("ref"):
        inputs = entry.inputs(shape, seed=0)
        checked = precision_of(entry, inputs, entry.run_helion(inputs))
        assert checked.ok
        assert {"dz", "dinitial_states"} <= {o["output"] for o in checked.outputs}
        plain = entry.run_helion(entry.inputs(suites.load().shape("smoke"), seed=0))
        assert "dz" not in plain and "dinitial_states" not in plain
        backward = combined.ssd_backward

        def wrong_dz(*args, **kwargs):
            grads = list(backward(*args, **kwargs))
            grads[6] = grads[6] * 1.01
            return tuple(grads)

        monkeypatch.setattr(combined, "ssd_backward", wrong_dz)
        broken = precision_of(entry, inputs, entry.run_helion(inputs))
    assert not broken.ok
    assert [o["output"] for o in broken.outputs if not o["ok"]] == ["dz"]


# ---------------------------------------------------------------------------------------------------
# state_dtype (mamba-ssm's main branch, its #972): the dtype the inter-chunk states are kept in


def _relative_errors(dtype, state_dtype):
    """Max error relative to the fp64 reference's largest value: the output, final_states and every gradient."""
    base = _problem(b=1, L=96, dtype=dtype)
    gen = torch.Generator().manual_seed(3)
    h, p, n = 4, 16, 16
    extra = {"D": torch.randn(h, generator=gen), "z": torch.randn(1, 96, h, p, generator=gen).to(dtype),
             "dt_bias": torch.rand(h, generator=gen) - 2.0, "initial_states": torch.randn(1, h, p, n, generator=gen)}
    leaves = {k: v.clone().requires_grad_() for k, v in {**base, **extra}.items()}
    with execution_mode("ref"):
        out, final = mamba2_kernels.mamba_chunk_scan_combined(**leaves, chunk_size=32, dt_softplus=True,
                                                              return_final_states=True, state_dtype=state_dtype)
        (out.float().square().sum() + final.square().sum()).backward()
    exact = {k: v.detach().double().requires_grad_() for k, v in leaves.items()}
    ref_out, ref_final = naive.ssd_chunked_ref(**exact, chunk_size=32, dt_softplus=True, return_final_states=True)
    (ref_out.square().sum() + ref_final.square().sum()).backward()
    pairs = {"out": (out, ref_out), "final_states": (final, ref_final),
             **{f"d{k}": (leaves[k].grad, exact[k].grad) for k in leaves}}
    return {name: ((mine.double() - ref).abs().max() / ref.abs().max()).item() for name, (mine, ref) in pairs.items()}


@pytest.mark.parametrize(("dtype", "state_dtype", "expected", "tolerance"), [
    (torch.float32, None, torch.float32, 1e-5),
    (torch.float32, torch.float16, torch.float16, 2e-3),  # states narrower than the inputs
    (torch.float16, None, torch.float16, 2e-3),
    (torch.float16, torch.float32, torch.float32, 2e-3),  # fp16 inputs, fp32 states
], ids=["fp32", "fp32-fp16_states", "fp16", "fp16-fp32_states"])
def test_state_dtype_is_the_states_dtype_forward_and_backward(monkeypatch, dtype, state_dtype, expected, tolerance):
    got = spy_states_dtypes(monkeypatch)
    errors = _relative_errors(dtype, state_dtype)
    assert got == {"bmm_chunk_scan_fwd": expected, "chunk_bwd_db_dc": expected}
    assert max(errors.values()) < tolerance, errors


def test_fp16_states_cost_precision_that_fp32_ones_keep():
    """What the argument does to the numbers: fp32 inputs with fp16 states lose what fp32 states keep."""
    exact, narrow = _relative_errors(torch.float32, None), _relative_errors(torch.float32, torch.float16)
    assert max(narrow.values()) > 20 * max(exact.values()), (exact, narrow)


@pytest.mark.parametrize("state_dtype", [torch.float64, "float32", torch.int32])
def test_a_state_dtype_the_kernels_cannot_keep_is_named(state_dtype):
    with pytest.raises(ValueError, match=r"state_dtype: expected None or one of torch.float32, torch.float16, "
                                         r"torch.bfloat16, got"):
        mamba2_kernels.mamba_chunk_scan_combined(**_problem(), chunk_size=32, state_dtype=state_dtype)


def test_an_eager_call_takes_the_autograd_function_and_not_the_operators_wrapper():
    """Only torch.compile needs the operator (its graph keeps the call whole); in eager code its autograd
    wrapper (schema defaults, pytree flattening, two redispatches) was a fifth of a training step's host work
    at small shapes, so an eager call goes through an autograd.Function over the same implementation."""
    g = torch.Generator().manual_seed(0)
    b, L, h, p, n = 1, 64, 2, 8, 8
    x = torch.randn(b, L, h, p, generator=g, requires_grad=True)
    dt = torch.rand(b, L, h, generator=g).requires_grad_()
    A = -torch.rand(h, generator=g)
    B, C = torch.randn(b, L, 1, n, generator=g), torch.randn(b, L, 1, n, generator=g)
    with execution_mode("ref"):
        out = mamba2_kernels.mamba_chunk_scan_combined(x, dt, A, B, C, 32)
        assert type(out.grad_fn).__name__ == "ssd_fwd_functionBackward"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            out.sum().backward()
    assert x.grad is not None and dt.grad is not None
    # Nor does its backward dispatch the backward's operator.
    assert "mamba2_kernels::ssd_combined_bwd" not in {event.name for event in profile.events()}


def test_an_eager_call_does_not_bind_its_arguments_by_signature(monkeypatch):
    """An autograd.Function with a separate setup_context makes torch bind the call's arguments to the
    forward's signature (``inspect.signature``) on every call; the SSD call's Function takes ctx itself."""
    import inspect

    signature = inspect.signature
    forwards = []
    monkeypatch.setattr(inspect, "signature", lambda fn, *a, **k: forwards.append(fn) or signature(fn, *a, **k))
    problem = _problem()
    with execution_mode("ref"):
        mamba2_kernels.mamba_chunk_scan_combined(**problem, chunk_size=32)
    assert [fn for fn in forwards if "differentiable.<locals>" in getattr(fn, "__qualname__", "")] == []


def test_a_call_on_fake_tensors_outside_torch_compile_gets_the_operators_fake_function():
    """make_fx, AOTAutograd and opcheck trace with fake tensors without a torch.compile session: the call must
    still reach the operator, whose fake function gives the outputs, and never run the kernels on them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, dt = torch.empty(2, 64, 4, 8), torch.empty(2, 64, 4)
        B = C = torch.empty(2, 64, 1, 16)
        out, final_states = mamba2_kernels.mamba_chunk_scan_combined(x, dt, torch.empty(4), B, C, 32,
                                                                     return_final_states=True)
    assert out.shape == x.shape and final_states.shape == (2, 4, 8, 16)
