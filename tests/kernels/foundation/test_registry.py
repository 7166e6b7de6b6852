"""The registry: every kernel of the layer is declared, with inputs, references and models that agree
with mamba-ssm (run in Triton's CPU interpreter)."""

from __future__ import annotations

import pytest
import torch

from mamba2_guard.bench.run import bench_case
from mamba2_kernels import registry
from mamba2_kernels.registry import BaselineUnavailable, MissingImplementation


def test_every_kernel_of_the_layer_is_declared_once():
    names = [e.name for e in registry.ENTRIES]
    assert len(names) == len(set(names)) and set(names) == set(registry.REGISTRY)
    assert {e.family for e in registry.ENTRIES} == set(registry.FAMILIES)
    phases = [e.phase for e in registry.ENTRIES]
    assert len(phases) == len(set(phases))
    ssd_phases = [e.phase for e in registry.select(family="ssd")]
    assert ssd_phases[:5] == [f"fwd_{i}" for i in range(1, 6)]
    for entry in registry.ENTRIES:
        assert entry.replaces and entry.reference and entry.outputs and entry.args


def test_unknown_names_suggest_the_closest_or_list_the_valid_ones():
    with pytest.raises(KeyError, match="unknown kernel 'chunk_stat'; did you mean 'chunk_state'\\?"):
        registry.get("chunk_stat")
    with pytest.raises(KeyError, match="valid kernels: chunk_cumsum, chunk_state"):
        registry.get("attention")
    with pytest.raises(KeyError, match="valid families: ssd, norm, conv"):
        registry.select(family="attention")


def test_inputs_are_seeded_and_valid(smoke_shape):
    entry = registry.get("chunk_scan")
    first, again, other = (entry.inputs(smoke_shape, s) for s in (7, 7, 8))
    for name in ("x", "B", "C", "dt", "dA_cumsum", "cb", "states"):
        assert torch.equal(first[name], again[name])
        assert not torch.equal(first[name], other[name])
    dt, dA = first["dt"], first["dA_cumsum"]
    assert dt.shape == (smoke_shape.batch, smoke_shape.nheads, smoke_shape.nchunks, smoke_shape.chunk_size)
    assert (dt > 0).all() and (dA < 0).all()
    assert (dA.diff(dim=-1) <= 0).all()  # cumulative within each chunk: decays stay in (0, 1]
    assert first["x"].dtype == smoke_shape.torch_dtype
    assert (first["A"] < 0).all()


def test_models_scale_with_the_problem(smoke_shape):
    longer = smoke_shape.replace(seqlen=smoke_shape.seqlen * 4)
    for entry in registry.ENTRIES:
        small, big = entry.bytes_moved(smoke_shape), entry.bytes_moved(longer)
        assert isinstance(small, int) and 0 < small < big, entry.name
        assert 0 < entry.flops(smoke_shape) < entry.flops(longer), entry.name


def test_missing_implementation_is_reported_never_passing(smoke_shape, monkeypatch):
    entry = registry.get("chunk_state")
    missing = registry.KernelEntry(**{**entry.__dict__, "helion": None})
    with pytest.raises(MissingImplementation):
        missing.run_helion(missing.inputs(smoke_shape, 0))
    case = bench_case(missing, smoke_shape, seed=0, device=torch.device("cpu"), rounds=1, warmup=0, timer=None,
                      nvml=None, peaks={})
    assert case.missing and case.precision is None and not case.samples_ms.helion


@pytest.mark.parametrize("name", [e.name for e in registry.ENTRIES
                                  if e.baseline_name == "mamba_ssm" and e.baseline_requires is None])
def test_reference_matches_mamba_ssm(name, smoke_shape):
    """The registry's argument mapping and the pure-PyTorch reference reproduce mamba-ssm's wrapper."""
    entry = registry.get(name)
    inputs = entry.inputs(smoke_shape, seed=3)
    ours = entry.run_reference(inputs, dtype=None)
    theirs = entry.run_baseline(inputs)
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    for output, value in theirs.items():
        assert ours[output].shape == value.shape, output
        torch.testing.assert_close(ours[output].float(), value.float(), atol=2e-4, rtol=2e-4, msg=output)


def test_conv_baseline_is_optional(smoke_shape):
    try:
        import causal_conv1d  # noqa: F401
    except ImportError:
        for name in ("causal_conv1d_fwd", "mamba2_layer_fwd"):
            entry = registry.get(name)
            with pytest.raises(BaselineUnavailable, match="needs causal_conv1d"):
                entry.run_baseline(entry.inputs(smoke_shape, 0))
    else:  # pragma: no cover - only where the CUDA package is installed
        pytest.skip("causal-conv1d is installed")


def test_layer_input_gradient_is_judged_slot_by_slot(smoke_shape):
    """dzxbcdt concatenates gradients of different scales (dz, dx, dB, dC, ddt): each slot is its own output,
    so that each gets an atol scaled to its own rms, as the whole SSD call's dx and ddt do."""
    entry = registry.get("mamba2_layer_fwd_bwd")
    inputs = entry.inputs(smoke_shape, 0)
    parts = entry.output_parts(inputs)["dzxbcdt"]
    s = smoke_shape
    assert parts == (("dz", s.d_ssm), ("dx", s.d_ssm), ("dB", s.ngroups * s.dstate), ("dC", s.ngroups * s.dstate),
                     ("ddt", s.nheads))
    grad = torch.randn(inputs["zxbcdt"].shape)
    split = entry._split_parts({"dzxbcdt": grad, "dA": grad[0, 0]}, inputs)
    assert sorted(split) == sorted(["dA"] + [f"dzxbcdt.{p}" for p, _ in parts])
    assert torch.equal(torch.cat([split[f"dzxbcdt.{p}"] for p, _ in parts], dim=-1), grad)
    # the reference goes through the same split, so every slot is compared
    reference = entry.run_reference(inputs)
    assert "dzxbcdt" not in reference and {f"dzxbcdt.{p}" for p, _ in parts} <= set(reference)


def test_the_call_traffic_model_counts_launches_and_a_compulsory_floor():
    from mamba2_kernels import suites
    from mamba2_kernels.registry.calls import call_traffic
    from mamba2_kernels.registry.models import sizes

    shape = suites.load().shape("nemotron3-nano")
    fwd, both = call_traffic(shape, backward=False), call_traffic(shape, backward=True)
    z = sizes(shape)
    assert (fwd.launches, fwd.mamba_ssm_launches, both.launches, both.mamba_ssm_launches) == (4, 5, 15, 19)
    assert (fwd.fused_launches, both.fused_launches) == (2, 8)
    # chunk_cumsum, then the rest in one launch: beyond one pass over the call it moves only dt_out and
    # dA_cumsum (written, read once) and final_states; it writes and reads back no cb (b, c, g, Q, Q fp32) and no
    # states, reads dt_out and dA_cumsum once (not twice), x and B once (not twice) and C once (not twice)
    assert fwd.fused_bytes == fwd.compulsory_bytes + 4 * z["dt"] + z["final"]
    saved = 2 * z["cb"] + 2 * z["states"] + 2 * z["dt"] + z["x"] + 2 * z["bc"]
    assert fwd.bytes - fwd.fused_bytes == saved
    # the backward's recompute makes dt_out and dA_cumsum in the state pass, which then reads neither back; its
    # dB and dC pass writes no fp32 partials to read back (the state terms' two, written and read as residuals),
    # reads dCB and dA_cumsum once, not twice; its dCB stage makes CB, which it read back
    assert both.bytes - both.fused_bytes == saved + 2 * z["dt"] + 6 * z["bc32"] + z["cb"] + z["dt"] + z["cb"]
    # forward: x, dt, B and C read once, out written once; the backward reads them and dout, writes the grads
    assert fwd.compulsory_bytes == 2 * z["x"] + z["dt_raw"] + 2 * z["bc"]
    assert both.compulsory_bytes == fwd.compulsory_bytes + 3 * z["x"] + 2 * z["dt_raw"] + 4 * z["bc"]
    # a chain of stages moves more than one pass; ours fuses two of mamba-ssm's forward stages
    assert fwd.compulsory_bytes < fwd.fused_bytes < fwd.bytes < fwd.mamba_ssm_bytes
    gated = call_traffic(shape.replace(z=True), backward=False)
    assert gated.bytes == fwd.bytes + z["x"] and gated.compulsory_bytes == fwd.compulsory_bytes + z["x"]
    # the same stages' arithmetic, but the fused forward makes C B^T (Q x Q over dstate, causal half) once
    # per head where bmm_chunk makes it (whole) once per group; the other fusions recompute nothing
    b, c, h, g, n, q = shape.batch, shape.seqlen // shape.chunk_size, shape.nheads, shape.ngroups, shape.dstate, \
        shape.chunk_size
    assert fwd.mamba_ssm_flops == fwd.flops
    assert fwd.fused_flops - fwd.flops == b * c * h * q * q * n - 2 * b * c * g * q * q * n > 0
    assert both.fused_flops - both.flops == fwd.fused_flops - fwd.flops
