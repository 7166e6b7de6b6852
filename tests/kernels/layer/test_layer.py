"""The whole Mamba-2 layer: ``mamba2_kernels.mamba_split_conv1d_scan_combined`` and ``mamba2_kernels.patch_mamba_ssm``.

CPU, Helion ref mode, fp32 (hl.dot takes no fp64): the forward and every gradient against a pure-PyTorch
fp64 composition of the references (``mamba2_kernels.conv.naive``, ``mamba2_kernels.ssd.naive.ssd_chunked_ref``,
``mamba2_kernels.norm.naive``, F.linear) over the option combinations; a ``mamba_ssm.modules.mamba2.Mamba2``
patched, in both ``use_mem_eff_path`` modes, against the same composition driven by the module's
parameters; the patch and its inverse. GPU tests compare with mamba-ssm itself (needs causal-conv1d).
"""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.debugging import aot_eager

import mamba2_kernels
from mamba2_kernels import _mamba_ssm
from mamba2_kernels._runtime import capture_launches
from mamba2_kernels.layer_naive import mamba_split_conv1d_scan_ref as layer_ref
from mamba2_kernels.ssd import forcing
from mamba2_kernels.testing import execution_mode

INF = float("inf")


# ---------------------------------------------------------------------------------------------------
# Problems


def _problem(b=2, L=40, h=4, p=8, g=1, n=8, width=4, d_nonssm=0, seed=0, options=()):
    """Leaves (fp32) and static keyword arguments of one call."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=gen) * scale + shift

    dim = h * p
    conv_dim = dim + 2 * g * n
    leaves = {
        "zxbcdt": rnd(b, L, 2 * d_nonssm + dim + conv_dim + h),
        "conv1d_weight": rnd(conv_dim, width, scale=0.5),
        "conv1d_bias": rnd(conv_dim, scale=0.1),
        "dt_bias": rnd(h, scale=0.5, shift=-1.0),
        "A": -torch.rand(h, generator=gen) * 2 - 0.5,
        "D": rnd(h, p) if "D_hdim" in options else rnd(h),
    }
    static = {"chunk_size": 16, "ngroups": g, "headdim": None if "D_hdim" in options else p}
    if "rmsnorm" in options:
        leaves["rmsnorm_weight"] = rnd(dim, scale=0.2, shift=1.0)
        static["rmsnorm_eps"] = 1e-5
    static["norm_before_gate"] = "norm_before_gate" in options
    if "outproj" in options or "outproj_bias" in options:
        leaves["outproj_weight"] = rnd(24, d_nonssm + dim, scale=(d_nonssm + dim) ** -0.5)
        if "outproj_bias" in options:
            leaves["outproj_bias"] = rnd(24, scale=0.1)
    if "initial_states" in options:
        leaves["initial_states"] = rnd(b, h, p, n)
        static["return_final_states"] = True
    if "dt_limit" in options:
        static["dt_limit"] = (0.05, 0.6)
    if "seq_idx" in options:
        cut = [L // 3, L // 3 + 5] if b > 1 else [L // 2]
        seq_idx = torch.zeros(b, L, dtype=torch.int32)
        for i in range(b):
            seq_idx[i, cut[i % len(cut)]:] = 1
        static["seq_idx"] = seq_idx
    if "no_conv_bias" in options:
        leaves["conv1d_bias"] = None
    return leaves, static


def _run(fn, leaves, static, dtype, seed=7):
    """Output(s) and gradients of every leaf for a random cotangent."""
    inputs = {k: (v.detach().to(dtype or v.dtype).requires_grad_(True) if v is not None else None)
              for k, v in leaves.items()}
    result = fn(**inputs, **static)
    outs = result if isinstance(result, tuple) else (result,)
    gen = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs]
    wanted = {k: v for k, v in inputs.items() if v is not None}
    grads = torch.autograd.grad(outs, list(wanted.values()), cotangents)
    return [o.detach() for o in outs], dict(zip(wanted, grads, strict=True))


def _close(mine, ref, name, rtol=1e-4, atol_scale=2e-5):
    assert mine.dtype == torch.float32 and torch.isfinite(mine).all(), name
    scale = ref.abs().max().item() + 1.0
    torch.testing.assert_close(mine.double(), ref, atol=atol_scale * scale, rtol=rtol, msg=lambda m: f"{name}: {m}")


def _compare(leaves, static):
    with execution_mode("ref"):
        outs, grads = _run(mamba2_kernels.mamba_split_conv1d_scan_combined, leaves, static, torch.float32)
    ref_outs, ref_grads = _run(layer_ref, leaves, static, torch.float64)
    for i, (mine, ref) in enumerate(zip(outs, ref_outs, strict=True)):
        _close(mine, ref, f"out[{i}]")
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        assert grads[name].dtype == torch.float32, name
        _close(grads[name], ref_grads[name], f"d{name}")


# ---------------------------------------------------------------------------------------------------
# The function against the fp64 composition

OPTIONS = [
    ("rmsnorm", "outproj"),  # Mamba2's defaults
    ("rmsnorm", "norm_before_gate", "outproj_bias", "D_hdim"),
    (),  # no norm: the SSD's own z gate, no out_proj
    ("outproj_bias",),  # no norm, out_proj: the gated output is recomputed in backward
    ("rmsnorm", "dt_limit", "initial_states"),
    ("rmsnorm", "outproj", "seq_idx", "no_conv_bias"),
    ("seq_idx", "initial_states", "D_hdim", "dt_limit"),
]


@pytest.mark.parametrize("g", [1, 2])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o) or "plain")
def test_matches_fp64_composition(options, g):
    leaves, static = _problem(g=g, options=options)
    _compare(leaves, static)


def test_every_fusion_forced_matches_fp64_composition():
    """The SSD's dt is a strided slice of zxbcdt here and its last chunk ragged: with every fusion a GPU's rule
    can pick forced on, forward and backward, the layer still gives the fp64 composition."""
    leaves, static = _problem(g=2, options=("rmsnorm", "outproj", "dt_limit", "initial_states", "seq_idx"))
    with contextlib.ExitStack() as stack:
        for stage in forcing.FUSE_STAGES:
            stack.enter_context(forcing.forced(stage, "fused"))
        launches = stack.enter_context(capture_launches())
        _compare(leaves, static)
    launched = {kernel.name for kernel, _ in launches}
    assert {"ssd_fused_fwd", "chunk_bwd_db_dc"} <= launched
    assert not launched & {"bmm_chunk", "chunk_scan", "chunk_state_bwd_db", "chunk_scan_bwd_dC"}


def test_state_dtype_reaches_the_ssd_forward_and_backward(monkeypatch):
    """mamba-ssm's main-branch ``state_dtype`` passes through the layer to both SSD passes: fp16 states of fp32
    inputs reach the stages that read them, and the result stays within fp16's rounding of the fp64 layer."""
    from tests.kernels.ssd.checks import spy_states_dtypes

    got = spy_states_dtypes(monkeypatch)
    leaves, static = _problem(options=("rmsnorm", "outproj", "initial_states"))
    with execution_mode("ref"):
        outs, grads = _run(mamba2_kernels.mamba_split_conv1d_scan_combined, leaves,
                           {**static, "state_dtype": torch.float16}, torch.float32)
    assert got == {"bmm_chunk_scan_fwd": torch.float16, "chunk_bwd_db_dc": torch.float16}
    ref_outs, ref_grads = _run(layer_ref, leaves, static, torch.float64)
    for name, mine, ref in [*(("out", o, r) for o, r in zip(outs, ref_outs, strict=True)),
                            *((f"d{k}", grads[k], ref_grads[k]) for k in grads)]:
        _close(mine, ref, name, rtol=5e-3, atol_scale=2e-3)


@pytest.mark.parametrize("width", [2, 3])
def test_conv_widths_and_ragged_length(width):
    leaves, static = _problem(b=1, L=37, h=2, p=16, g=2, n=16, width=width, options=("rmsnorm", "outproj"))
    _compare(leaves, static)


@pytest.mark.parametrize("options", [("rmsnorm", "outproj", "seq_idx", "initial_states"),
                                     ("seq_idx", "initial_states", "D_hdim")], ids=["rmsnorm", "z_gate"])
def test_triton_interpreter_strided_views(options):
    # Helion's generated Triton code in the interpreter: real tiling and masking on the strided views of
    # zxbcdt (dt, z) and of the conv output (x, B, C), ragged last chunk; the kernels write dz, ddt and the
    # conv's dx into slices of the input gradient, and the SSD's dx, dB, dC into slices of one buffer. dz comes
    # from the norm's backward, or without the norm from the SSD's z gate.
    leaves, static = _problem(b=1, L=24, h=2, p=16, g=2, n=16, options=options)
    with execution_mode("triton"):
        outs, grads = _run(mamba2_kernels.mamba_split_conv1d_scan_combined, leaves, static, torch.float32)
    ref_outs, ref_grads = _run(layer_ref, leaves, static, torch.float64)
    for i, (mine, ref) in enumerate(zip(outs, ref_outs, strict=True)):
        _close(mine, ref, f"out[{i}]")
    for name in grads:
        _close(grads[name], ref_grads[name], f"d{name}")


def test_swiglu_part_d_nonssm():
    leaves, static = _problem(L=32, d_nonssm=12, options=("rmsnorm", "outproj_bias"))
    _compare(leaves, static)
    leaves, static = _problem(L=32, d_nonssm=12, options=())  # no out_proj: out is (b, L, d_nonssm + dim)
    _compare(leaves, static)


def test_activation_none():
    leaves, static = _problem(L=32, options=("rmsnorm",))
    _compare(leaves, {**static, "activation": None})


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"zxbcdt": torch.zeros(2, 40)}, ValueError, "zxbcdt: expected"),
    ({"zxbcdt": torch.zeros(2, 40, 85)}, ValueError, "zxbcdt: last dim"),
    ({"headdim": None}, ValueError, "headdim: required"),
    ({"ngroups": 3}, ValueError, "ngroups: expected"),
    ({"conv1d_weight": torch.zeros(39, 4)}, ValueError, "conv1d_weight: expected"),
    ({"conv1d_weight": torch.zeros(48, 5)}, NotImplementedError, "conv1d_weight: the causal conv1d supports widths"),
    ({"conv1d_bias": torch.zeros(47)}, ValueError, "conv1d_bias: expected"),
    ({"dt_bias": torch.zeros(3)}, ValueError, r"dt_bias: expected \(4,\)"),
    ({"A": torch.zeros(5)}, ValueError, r"A: expected \(4,\)"),
    ({"D": torch.zeros(4, 3)}, ValueError, "headdim: 8 disagrees"),
    ({"initial_states": torch.zeros(2, 4, 8, 7)}, ValueError, "initial_states: expected"),
    ({"seq_idx": torch.zeros(2, 41, dtype=torch.int32)}, ValueError, "seq_idx: expected"),
    ({"dt_limit": (1.0, 0.0)}, ValueError, "dt_limit: expected"),
    ({"rmsnorm_weight": torch.zeros(31)}, ValueError, "rmsnorm_weight: expected"),
    ({"outproj_weight": torch.zeros(24, 31)}, ValueError, "outproj_weight: expected"),
    ({"outproj_bias": torch.zeros(24)}, ValueError, "outproj_bias: given without outproj_weight"),
    ({"chunk_size": 0}, ValueError, "chunk_size: expected"),
    ({"chunk_size": 24}, NotImplementedError, "chunk_size: only powers of two"),
    ({"activation": "relu"}, NotImplementedError, "activation"),
    ({"zxbcdt": torch.zeros(2, 40, 84, dtype=torch.float64)}, ValueError, "zxbcdt: expected float16, bfloat16 or"),
    ({"zxbcdt": torch.zeros(2, 0, 84)}, ValueError, "zxbcdt: expected no empty dimension"),
    ({"seq_idx": torch.zeros(2, 40)}, ValueError, "seq_idx: expected an integer tensor"),
    ({"seq_idx": torch.tensor([[1] * 20 + [0] * 20] * 2, dtype=torch.int32)}, ValueError,
     "seq_idx: expected non-decreasing"),
    ({"state_dtype": torch.float64}, ValueError, "state_dtype: expected None or one of"),
])
def test_bad_arguments_are_named(change, error, message):
    leaves, static = _problem()
    with pytest.raises(error, match=message):
        mamba2_kernels.mamba_split_conv1d_scan_combined(**{**leaves, **static, **change})


def test_saves_no_conv_or_norm_output():
    # mamba-ssm's recomputation policy: saved are zxbcdt, the weights, the SSD's pre-gate output and rstd.
    leaves, static = _problem(options=("rmsnorm", "outproj"))
    inputs = {k: v.requires_grad_(True) for k, v in leaves.items()}
    with execution_mode("ref"):
        out = mamba2_kernels.mamba_split_conv1d_scan_combined(**inputs, **static)
    b, L = inputs["zxbcdt"].shape[:2]
    saved = [t for t in out.grad_fn.saved_tensors if t is not None]
    shapes = sorted(tuple(t.shape) for t in saved)
    assert (b, L, 4, 8) in shapes  # out_x
    assert (b, L, 48) not in shapes and (b, L, 32) not in shapes  # neither xBC_conv nor the norm output


# ---------------------------------------------------------------------------------------------------
# mamba_ssm.modules.mamba2.Mamba2, patched


@pytest.fixture
def mamba2():
    try:
        return _mamba_ssm.module("modules.mamba2")
    except ImportError as exc:  # mamba2.py imports huggingface_hub
        pytest.skip(f"mamba_ssm.modules.mamba2 cannot be imported: {exc}")


@pytest.fixture
def patched(mamba2):
    mamba2_kernels.patch_mamba_ssm()
    try:
        yield mamba2
    finally:
        mamba2_kernels.unpatch_mamba_ssm()


def _module_ref(module, u):
    """The module's forward as the fp64 composition, on fp64 copies of its parameters (returned)."""
    params = {name: p.detach().double().requires_grad_(True) for name, p in module.named_parameters()}
    zxbcdt = F.linear(u.double(), params["in_proj.weight"], params.get("in_proj.bias"))
    D = params["D"].view(module.nheads, module.headdim) if module.D_has_hdim else params["D"]
    kwargs = {} if module.dt_limit == (0.0, INF) else {"dt_limit": module.dt_limit}
    out = layer_ref(zxbcdt, params["conv1d.weight"][:, 0], params.get("conv1d.bias"), params["dt_bias"],
                    -torch.exp(params["A_log"]), D, module.chunk_size,
                    rmsnorm_weight=params.get("norm.weight"), rmsnorm_eps=module.norm.eps if module.rmsnorm else 1e-6,
                    outproj_weight=params["out_proj.weight"], outproj_bias=params.get("out_proj.bias"),
                    headdim=module.headdim, ngroups=module.ngroups, norm_before_gate=module.norm_before_gate,
                    **kwargs)
    return out, params


def _module_case(mamba2, use_mem_eff_path, ngroups, seed=0, **extra):
    torch.manual_seed(seed)
    module = mamba2.Mamba2(d_model=64, d_state=16, headdim=16, ngroups=ngroups, chunk_size=16,
                           use_mem_eff_path=use_mem_eff_path, device="cpu", **extra)
    u = torch.randn(2, 40, 64, generator=torch.Generator().manual_seed(seed + 1))
    dout = torch.randn(2, 40, 64, generator=torch.Generator().manual_seed(seed + 2))
    return module, u, dout


MODULE_CASES = [
    (True, 1, {}),
    (True, 2, {}),
    (False, 1, {}),
    (False, 2, {}),
    (True, 2, {"D_has_hdim": True, "norm_before_gate": True, "bias": True, "dt_limit": (0.01, 0.5)}),
    (False, 1, {"rmsnorm": False, "conv_bias": False}),
]


@pytest.mark.parametrize(("use_mem_eff_path", "ngroups", "extra"), MODULE_CASES,
                         ids=[f"memeff{int(m)}-g{g}" + ("-" + "-".join(e) if e else "") for m, g, e in MODULE_CASES])
def test_patched_mamba2_matches_reference(patched, use_mem_eff_path, ngroups, extra):
    module, u, dout = _module_case(patched, use_mem_eff_path, ngroups, **extra)
    if module.rmsnorm:
        from mamba2_kernels.norm.rmsnorm import RMSNormGated
        assert isinstance(module.norm, RMSNormGated)
    with execution_mode("ref"):
        out = module(u)
        out.backward(dout)
    ref, ref_params = _module_ref(module, u)
    ref.backward(dout.double())
    _close(out.detach(), ref.detach(), "out")
    for name, param in module.named_parameters():
        _close(param.grad, ref_params[name].grad, f"d{name}")


COMPILE_CASES = [pytest.param(device, memeff, id=f"{device}-memeff{int(memeff)}",
                              marks=[pytest.mark.gpu] if device == "cuda" else [])
                 for device in ("cpu", "cuda") for memeff in (True, False)]


@pytest.mark.parametrize(("device", "use_mem_eff_path"), COMPILE_CASES)
def test_patched_mamba2_compiles_whole_once_for_three_lengths(patched, device, use_mem_eff_path):
    """torch.compile(fullgraph=True, dynamic=True) of a patched Mamba2: no graph break (fullgraph raises on
    one), one graph for three sequence lengths (one of them not a multiple of the chunk), and the eager
    outputs and gradients. The drop-ins are torch.library operators with fake functions, so Dynamo keeps them
    in the graph; before, each was a graph break. On a GPU Inductor compiles the rest of the module (the
    projections), so the results agree to rounding."""
    module, _, _ = _module_case(patched, use_mem_eff_path, ngroups=2)
    module = module.to(device)
    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return (aot_eager if device == "cpu" else torch._inductor.compile)(graph, example_inputs)

    torch._dynamo.reset()
    compiled_module = torch.compile(module, backend=backend, fullgraph=True, dynamic=True)
    tolerance = {} if device == "cpu" else {"atol": 1e-3, "rtol": 1e-3}
    with execution_mode("ref") if device == "cpu" else contextlib.nullcontext():
        for seqlen in (40, 64, 23):
            u = torch.randn(2, seqlen, 64, generator=torch.Generator().manual_seed(seqlen)).to(device)
            dout = torch.randn(2, seqlen, 64, generator=torch.Generator().manual_seed(seqlen + 1)).to(device)
            module.zero_grad()
            eager = module(u)
            eager.backward(dout)
            grads = {name: param.grad.clone() for name, param in module.named_parameters()}
            module.zero_grad()
            compiled = compiled_module(u)
            compiled.backward(dout)
            torch.testing.assert_close(compiled, eager, **tolerance)
            for name, param in module.named_parameters():
                torch.testing.assert_close(param.grad, grads[name], msg=f"d{name} at seqlen {seqlen}", **tolerance)
    # Dynamo also hands the backend an empty graph of a frame with no tensor work; the module is one graph,
    # which holds the drop-ins' operators.
    graphs = [g for g in graphs if len(g.graph.nodes)]
    assert len(graphs) == 1
    ops = {str(node.target).removesuffix(".default") for node in graphs[0].graph.nodes if node.op == "call_function"}
    expected = {"mamba2_kernels.ssd_combined_fwd", "mamba2_kernels.causal_conv1d_fwd",
                "mamba2_kernels.gated_rmsnorm_fwd"}
    assert expected <= ops, sorted(ops)


@pytest.mark.gpu
def test_patched_mamba2_trains_under_cuda_graphs(patched):
    """``torch.compile(mode="reduce-overhead")``: Inductor records the patched module's forward and backward,
    the drop-ins' launches with them, into CUDA graphs and replays them; every step's output and gradients are
    the eager step's. The drop-ins' host work (config lookup, argument checks) runs at the warm-up and the
    recording; a replay is their launches alone."""
    module, u, dout = _module_case(patched, True, ngroups=2)
    module, u, dout = module.cuda(), u.cuda(), dout.cuda()
    torch._dynamo.reset()
    compiled_module = torch.compile(module, fullgraph=True, dynamic=True, mode="reduce-overhead")
    for step in range(4):  # warm-up, recording, then replays
        module.zero_grad(set_to_none=True)
        eager = module(u)
        eager.backward(dout)
        grads = {name: param.grad.clone() for name, param in module.named_parameters()}
        module.zero_grad(set_to_none=True)
        torch.compiler.cudagraph_mark_step_begin()
        compiled = compiled_module(u)
        compiled.backward(dout)
        torch.testing.assert_close(compiled, eager, atol=1e-3, rtol=1e-3, msg=f"out at step {step}")
        for name, param in module.named_parameters():
            torch.testing.assert_close(param.grad, grads[name], atol=1e-3, rtol=1e-3, msg=f"d{name} at step {step}")


def test_patch_routes_both_paths_through_our_kernels(patched, monkeypatch):
    from mamba2_kernels.conv import causal_conv1d as conv_mod
    from mamba2_kernels.norm import gated_rmsnorm as norm_mod
    from mamba2_kernels.ssd import combined as ssd_mod

    calls = []

    def spy(module, name):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **k: (calls.append(name), original(*a, **k))[1])

    import mamba2_kernels.layer_fn as layer_fn
    for module, name in [(layer_fn, "causal_conv1d_fwd"), (layer_fn, "ssd_forward"), (layer_fn, "gated_rmsnorm_fwd"),
                         (conv_mod, "causal_conv1d_fwd"), (ssd_mod, "ssd_forward"),
                         (norm_mod, "gated_rmsnorm_fwd_kernel")]:
        spy(module, name)
    for use_mem_eff_path in (True, False):
        module, u, _ = _module_case(patched, use_mem_eff_path, 1)
        calls.clear()
        with execution_mode("ref"), torch.no_grad():
            module(u)
        assert {"causal_conv1d_fwd", "ssd_forward"} <= set(calls), (use_mem_eff_path, calls)
        assert "gated_rmsnorm_fwd" in calls or "gated_rmsnorm_fwd_kernel" in calls, (use_mem_eff_path, calls)


def test_patch_and_unpatch_restore_exactly(mamba2):
    combined = _mamba_ssm.module("ops.triton.ssd_combined")
    gated = _mamba_ssm.module("ops.triton.layernorm_gated")
    names = ("mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined", "causal_conv1d_fn", "RMSNormGated")
    before_mamba2 = {name: getattr(mamba2, name) for name in names}
    before = (combined.mamba_chunk_scan_combined, combined.mamba_split_conv1d_scan_combined, gated.rmsnorm_fn,
              gated.RMSNorm)
    from mamba2_kernels.conv.causal_conv1d import causal_conv1d_fn
    from mamba2_kernels.layer import is_patched
    from mamba2_kernels.norm.rmsnorm import RMSNormGated, rmsnorm_fn
    try:
        first = mamba2_kernels.patch_mamba_ssm()
        second = mamba2_kernels.patch_mamba_ssm()  # idempotent
        assert first == second and is_patched()
        assert {"mamba_ssm.modules.mamba2", "mamba_ssm.ops.triton.ssd_combined",
                "mamba_ssm.ops.triton.layernorm_gated"} <= set(first)
        assert mamba2.mamba_chunk_scan_combined is mamba2_kernels.mamba_chunk_scan_combined
        assert mamba2.mamba_split_conv1d_scan_combined is mamba2_kernels.mamba_split_conv1d_scan_combined
        assert combined.mamba_split_conv1d_scan_combined is mamba2_kernels.mamba_split_conv1d_scan_combined
        assert mamba2.causal_conv1d_fn is causal_conv1d_fn
        assert mamba2.RMSNormGated is RMSNormGated and gated.RMSNorm is RMSNormGated
        assert gated.rmsnorm_fn is rmsnorm_fn
    finally:
        mamba2_kernels.unpatch_mamba_ssm()
    assert mamba2_kernels.unpatch_mamba_ssm() == [] and not is_patched()  # idempotent
    assert {name: getattr(mamba2, name) for name in names} == before_mamba2
    assert (combined.mamba_chunk_scan_combined, combined.mamba_split_conv1d_scan_combined, gated.rmsnorm_fn,
            gated.RMSNorm) == before


def test_patch_reaches_model_code_that_imported_mamba_ssms_functions(mamba2, monkeypatch):
    """A model's own module (Hugging Face's modeling files, a hub model's remote code) imports mamba-ssm's
    functions by name, often before the job patches: the patch swaps them there too, and unpatch restores
    them; this package's modules keep ours; causal-conv1d's own function stays (ours takes no initial states)."""
    import types

    from mamba2_kernels.ssd import combined as ours_module

    combined = _mamba_ssm.module("ops.triton.ssd_combined")
    gated = _mamba_ssm.module("ops.triton.layernorm_gated")
    remote = types.ModuleType("transformers_modules.some_org.modeling_hybrid")
    theirs_conv = object()
    remote.__dict__.update(mamba_chunk_scan_combined=combined.mamba_chunk_scan_combined,
                           mamba_split_conv1d_scan_combined=combined.mamba_split_conv1d_scan_combined,
                           rmsnorm_fn=gated.rmsnorm_fn, causal_conv1d_fn=theirs_conv)
    before = dict(vars(remote))
    monkeypatch.setitem(sys.modules, remote.__name__, remote)
    try:
        assert remote.__name__ in mamba2_kernels.patch_mamba_ssm()
        assert remote.mamba_chunk_scan_combined is mamba2_kernels.mamba_chunk_scan_combined
        assert remote.mamba_split_conv1d_scan_combined is mamba2_kernels.mamba_split_conv1d_scan_combined
        assert remote.rmsnorm_fn is mamba2_kernels.rmsnorm_fn and remote.causal_conv1d_fn is theirs_conv
        later = types.ModuleType("imported_while_patched")  # `from ...ssd_combined import ...` now gives ours
        later.mamba_chunk_scan_combined = combined.mamba_chunk_scan_combined
        monkeypatch.setitem(sys.modules, later.__name__, later)
    finally:
        mamba2_kernels.unpatch_mamba_ssm()
    assert dict(vars(remote)) == before
    assert later.mamba_chunk_scan_combined is mamba2_kernels.mamba_chunk_scan_combined
    assert ours_module.mamba_chunk_scan_combined is mamba2_kernels.mamba_chunk_scan_combined


def test_patching_without_mamba_ssm_says_there_is_nothing_to_replace(monkeypatch):
    """A training environment without mamba-ssm: nothing calls its kernels (transformers takes its PyTorch
    path), so the patch refuses in one line that points at the functions themselves, and changes nothing."""
    from mamba2_kernels import layer

    monkeypatch.delitem(sys.modules, "mamba_ssm", raising=False)
    monkeypatch.setattr(layer.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(_mamba_ssm.MambaSsmUnavailable) as refused:
        mamba2_kernels.patch_mamba_ssm()
    message = str(refused.value)
    assert "\n" not in message and "mamba-ssm is not installed" in message
    assert "mamba2_kernels.mamba_chunk_scan_combined" in message and not layer.is_patched()

def test_unpatched_mamba2_falls_back_as_before(mamba2, monkeypatch):
    # Without causal-conv1d, mamba-ssm's own non-fused path uses nn.Conv1d; after unpatch it does again.
    mamba2_kernels.patch_mamba_ssm()
    mamba2_kernels.unpatch_mamba_ssm()
    if mamba2.causal_conv1d_fn is not None:
        pytest.skip("causal-conv1d is installed: mamba-ssm does not fall back to nn.Conv1d")
    module, u, _ = _module_case(mamba2, False, 1, rmsnorm=False)
    calls = []
    conv_forward = module.conv1d.forward
    monkeypatch.setattr(module.conv1d, "forward", lambda *a: (calls.append(1), conv_forward(*a))[1])
    module(u[:, :16])  # mamba-ssm's Triton SSD in the Triton interpreter; the conv is nn.Conv1d
    assert calls


# ---------------------------------------------------------------------------------------------------
# GPU: against mamba-ssm itself (needs causal-conv1d for its fused path)


@pytest.mark.gpu
@pytest.mark.parametrize("shape_name", ["nemotron3-nano", "mamba2-default"])
def test_gpu_matches_mamba_ssm(shape_name):
    pytest.importorskip("causal_conv1d")
    from mamba2_kernels import suites

    shape = suites.load().shape(shape_name)
    combined = _mamba_ssm.module("ops.triton.ssd_combined")
    h, p, g, n, Q = shape.nheads, shape.headdim, shape.ngroups, shape.dstate, shape.chunk_size
    dtype = getattr(torch, shape.dtype)
    b, L = shape.batch, min(shape.seqlen, 4096)
    dim = h * p
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s, scale=1.0, shift=0.0, dt=dtype):
        return (torch.randn(*s, generator=gen, device="cuda") * scale + shift).to(dt)

    # dtypes as in a bf16 Mamba2: A, D and dt_bias stay fp32 (mamba2.py builds them so).
    leaves = {
        "zxbcdt": rnd(b, L, 2 * dim + 2 * g * n + h),
        "conv1d_weight": rnd(dim + 2 * g * n, shape.conv_width, scale=0.5),
        "conv1d_bias": rnd(dim + 2 * g * n, scale=0.1),
        "dt_bias": rnd(h, scale=0.5, shift=-3.0, dt=torch.float32),
        "A": -torch.rand(h, generator=gen, device="cuda") * 8 - 1,
        "D": rnd(h, dt=torch.float32),
        "rmsnorm_weight": rnd(dim, scale=0.1, shift=1.0),
        "outproj_weight": rnd(1024, dim, scale=dim ** -0.5),
    }
    static = {"chunk_size": Q, "headdim": p, "ngroups": g, "rmsnorm_eps": 1e-5,
              "norm_before_gate": shape.norm_before_gate}
    ours_out, ours_grads = _run(mamba2_kernels.mamba_split_conv1d_scan_combined, leaves, static, None)
    ref_out, ref_grads = _run(combined.mamba_split_conv1d_scan_combined, leaves, static, None)
    for name, mine, ref in [("out", ours_out[0], ref_out[0])] + [(k, ours_grads[k], ref_grads[k]) for k in ref_grads]:
        assert mine.dtype == ref.dtype, name
        err = (mine.float() - ref.float()).abs().max().item()
        assert err <= 2e-2 * (ref.float().abs().max().item() + 1.0), (name, err)


# ---------------------------------------------------------------------------------------------------
# mamba2_guard.dev.module_bench (mamba2-guard dev module-bench): the full module, GEMMs included


def _module_script():
    import types

    from mamba2_guard import cli
    from mamba2_guard.dev import module_bench

    def main(argv):  # the tool as `mamba2-guard dev module-bench ARGV` runs it, exceptions not caught
        args = cli.build_parser().parse_args(["dev", "module-bench", *argv])
        return args.func(args)

    return types.SimpleNamespace(build=module_bench.build, gradients=module_bench.gradients,
                                 differences=module_bench.differences, summarize=module_bench.summarize, main=main)


def test_module_script_builds_the_suite_layer_at_any_width(mamba2):
    """A width that does not divide d_ssm (Nemotron's 2688 against 4096) still gives the suite's SSM part
    and no MLP part; the patched module's gradients are finite, and the report compares tensor by tensor."""
    from mamba2_kernels import suites

    script = _module_script()
    shape = suites.load().shape("smoke")
    module, u, dout = script.build(shape, 42, "cpu", seed=0)
    assert module.d_ssm == module.d_inner == shape.d_ssm and module.nheads == shape.nheads
    assert module.in_proj.out_features == 2 * shape.d_ssm + 2 * shape.ngroups * shape.dstate + shape.nheads
    assert u.shape == dout.shape == (shape.batch, shape.seqlen, 42) and u.requires_grad
    try:
        with execution_mode("ref"):
            grads = script.gradients(module, u, dout, patched=True)
    finally:
        mamba2_kernels.unpatch_mamba_ssm()
    assert all(p.grad is None for p in module.parameters()) and u.grad is None  # left as found
    assert {"out", "du", "din_proj.weight", "dout_proj.weight", "dA_log", "dD", "ddt_bias"} <= set(grads)
    same = script.differences(grads, grads)
    assert all(r["max_abs_diff"] == 0.0 and r["finite"] for r in same.values())
    broken = {**grads, "du": grads["du"] + 1.0}
    broken["dD"] = grads["dD"].clone()
    broken["dD"][0] = float("nan")
    report = script.differences(broken, grads)
    assert report["du"]["max_abs_diff"] == pytest.approx(1.0) and not report["dD"]["finite"]


def _smoke_compiled_step(measure, backend):
    """``measure`` (``module_bench.compiled_step`` or its ``..._or_failure``) of the patched smoke-shape module in
    Helion's ref mode, compiled by ``backend``: (its report, the module, its input)."""
    from mamba2_guard.dev import module_bench
    from mamba2_kernels import suites

    module, u, dout = module_bench.build(suites.load().shape("smoke"), 42, "cpu", seed=0)
    torch._dynamo.reset()
    try:
        with execution_mode("ref"):
            return measure(module, u, dout, rounds=2, steps=1, backend=backend), module, u
    finally:
        mamba2_kernels.unpatch_mamba_ssm()
        torch._dynamo.reset()


def test_module_script_times_the_patched_steps_eager_against_compiled(mamba2):
    """``--compiled``: the patched module's training step both ways, the compiled one really compiled (one
    graph, the drop-ins' operators in it), and the gradients left as found."""
    from mamba2_guard.dev import module_bench

    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return aot_eager(graph, example_inputs)

    step, module, u = _smoke_compiled_step(module_bench.compiled_step, backend)
    assert step["mode"] == "default" and [len(times) for times in step["samples_ms"].values()] == [2, 2]
    assert step["median_ms"]["eager"] > 0 and step["median_ms"]["compiled"] > 0 and step["compiled_vs_eager"] > 0
    ops = {str(node.target) for g in graphs for node in g.graph.nodes if node.op == "call_function"}
    assert "mamba2_kernels.ssd_combined_fwd.default" in ops
    assert all(p.grad is None for p in module.parameters()) and u.grad is None


def test_module_script_records_a_failed_compiled_step_with_its_traceback(mamba2, capsys):
    """A compiled step that raises (Inductor's CUDA graphs refusing an operator's outputs, on a GPU) leaves the
    module's other measurements standing: its report holds the error in one line and the whole traceback, the
    gradients are left as found, and the run's summary names the failure and exits 1."""
    from mamba2_guard.dev import module_bench

    def refusing(graph, example_inputs):
        raise RuntimeError("These storage data ptrs are not allocated in pool (0, 1)\nsecond line")

    step, module, u = _smoke_compiled_step(module_bench.compiled_step_or_failure, refusing)
    assert step["mode"] == "default" and "median_ms" not in step
    assert step["error"] == "RuntimeError: These storage data ptrs are not allocated in pool (0, 1)"
    assert "\n" not in step["error"] and "def refusing" not in step["error"]
    assert "Traceback (most recent call last)" in step["traceback"] and "second line" in step["traceback"]
    assert all(p.grad is None for p in module.parameters()) and u.grad is None
    phase = {"median_ms": {"helion": 1.0, "mamba_ssm": 1.5, "gemms": 0.25}, "speedup_vs_mamba_ssm": 1.5}
    report = {"shape": "smoke", "fwd": phase, "fwd_bwd": phase, "compiled_step": step,
              "precision": {"du": {"max_abs_diff": 0.0, "max_abs_diff_over_rms": 0.0}}}
    assert module_bench.summary(report, 42) == 1
    assert ("smoke d_model=42 fwd_bwd under torch.compile (default): FAILED " + step["error"]
            in capsys.readouterr().out)
    del report["compiled_step"]
    assert module_bench.summary(report, 42) == 0


@pytest.mark.parametrize(("argv", "mode"), [([], None), (["--compiled"], "default"),
                                             (["--compiled", "reduce-overhead"], "reduce-overhead")])
def test_module_script_names_the_compile_mode_it_times(argv, mode):
    from mamba2_guard import cli

    args = cli.build_parser().parse_args(["dev", "module-bench", "--shape", "smoke", "--d-model", "8",
                                          "--out", "x.json", *argv])
    assert args.compiled == mode


def test_module_script_rejects_bad_arguments(mamba2, capsys):
    from mamba2_kernels import suites

    script = _module_script()
    with pytest.raises(SystemExit):
        script.main(["--shape", "smoke", "--d-model", "0", "--out", "x.json"])
    assert "--d-model: expected an integer >= 1, got '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--shape", "smoke", "--d-model", "8", "--compiled", "fast", "--out", "x.json"])
    assert "--compiled: invalid choice: 'fast' (choose from 'default', 'reduce-overhead')" in capsys.readouterr().err
    with pytest.raises(KeyError, match="nemotron3-nano"):
        script.main(["--shape", "nemotron3-nan", "--d-model", "64", "--out", "x.json"])
    other_groups = suites.load().shape("smoke").replace(norm_group_size=64)
    with pytest.raises(ValueError, match="--shape smoke: Mamba2 normalizes groups of 32, the suite shape of 64"):
        script.build(other_groups, 64, "cpu", seed=0)


def test_module_script_says_it_needs_causal_conv1d_before_building_a_module(mamba2, capsys, monkeypatch):
    """mamba-ssm sets its causal-conv1d functions to None when the package is missing; its Mamba2 then fails
    inside the forward with a TypeError. The tool names the package instead, with exit 2."""
    from mamba2_kernels.tuning import mamba_ssm

    monkeypatch.setattr(mamba_ssm.module("ops.triton.ssd_combined"), "causal_conv1d_fwd_function", None)
    with pytest.raises(SystemExit) as exited:
        _module_script().main(["--shape", "smoke", "--d-model", "8", "--out", "x.json"])
    assert exited.value.code == 2
    assert "needs causal-conv1d" in capsys.readouterr().err


def test_module_script_reports_the_guards_paired_speedup():
    script = _module_script()
    summary = script.summarize({"helion": [1.0, 1.1, 0.9], "mamba_ssm": [1.2, 1.21, 1.0],
                                "gemms": [0.5, 0.5, 0.5]})
    assert summary["median_ms"] == {"helion": 1.0, "mamba_ssm": 1.2, "gemms": 0.5}
    assert summary["speedup_vs_mamba_ssm"] == pytest.approx(1.0 / 0.9)  # median of 1.2, 1.1, 1.111; not 1.2 / 1.0
    assert summary["gemm_share"] == {"helion": 0.5, "mamba_ssm": pytest.approx(0.5 / 1.2)}
