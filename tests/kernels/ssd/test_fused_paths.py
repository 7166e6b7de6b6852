"""The fused stages by path (``mamba2_kernels.ssd.fused_paths``): the GPU's rules decide which kernels a call
launches, and the chain gives the fused kernels' results, forward and backward, in Helion's ref mode."""

from __future__ import annotations

import pytest
import torch

import mamba2_kernels
from mamba2_kernels import config_store
from mamba2_kernels._runtime import capture_launches
from mamba2_kernels.ssd import fused_paths
from mamba2_kernels.testing import execution_mode
from tests.kernels.ssd.checks import seq_idx_rows

CHAINS = {"chunk_state_passing": {"chunk_state", "state_passing"},
          "chunk_state_passing_bwd": {"chunk_scan_bwd_dstates", "state_passing_bwd"}}
FUSED_KERNELS = set(CHAINS)
CHAIN_KERNELS = set().union(*CHAINS.values())
DB_DC_CHAIN = {"chunk_state_bwd_db", "chunk_scan_bwd_dC", "bmm_chunk_bwd"}  # the kernels chunk_bwd_db_dc fuses


def _call(b=2, L=80, h=4, p=16, g=2, n=16, chunk_size=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tensors = {"x": torch.randn(b, L, h, p, generator=gen), "dt": torch.randn(b, L, h, generator=gen) * 0.5 - 3.0,
               "A": -torch.rand(h, generator=gen) * 4 - 0.5, "B": torch.randn(b, L, g, n, generator=gen),
               "C": torch.randn(b, L, g, n, generator=gen), "D": torch.randn(h, generator=gen),
               "initial_states": torch.randn(b, h, p, n, generator=gen)}
    return tensors, {"chunk_size": chunk_size, "seq_idx": seq_idx_rows(b, L), "return_final_states": True}


def _results(tensors, options):
    """Every output and gradient of the call, and the kernels its forward and its backward launched (by phase:
    forward, backward, both)."""
    leaves = {name: t.clone().requires_grad_(True) for name, t in tensors.items()}
    gen = torch.Generator().manual_seed(7)
    with execution_mode("ref"):
        with capture_launches() as forward:
            out, final = mamba2_kernels.mamba_chunk_scan_combined(**leaves, **options)
        with capture_launches() as backward:
            loss = (out * torch.randn(out.shape, generator=gen)).sum() + (
                final * torch.randn(final.shape, generator=gen)).sum()
            loss.backward(inputs=list(leaves.values()))
    launched = {"forward": {kernel.name for kernel, _ in forward}, "backward": {kernel.name for kernel, _ in backward}}
    launched["both"] = launched["forward"] | launched["backward"]
    return {"out": out, "final_states": final, **{f"d{name}": leaf.grad for name, leaf in leaves.items()}}, launched


def _launched(tensors, options, phase="both") -> set[str]:
    """The kernels the call's forward, its backward or both launch; a forward alone runs without gradients."""
    if phase != "forward":
        return _results(tensors, options)[1][phase]
    with execution_mode("ref"), capture_launches() as launches:
        mamba2_kernels.mamba_chunk_scan_combined(**tensors, **options)
    return {kernel.name for kernel, _ in launches}


@pytest.fixture
def rule_file(tmp_path, monkeypatch):
    """Write the CPU's config file with the given chain rules, and point lookups at it."""
    monkeypatch.setattr(config_store, "CONFIG_DIR", tmp_path)
    config_store.forget()

    def write(rules: dict[str, dict[str, int]], kind: str = "chain") -> None:
        config_store.save(tmp_path / "cpu.yaml", config_store.ConfigFile(
            selection={stage: {kind: rule} for stage, rule in rules.items()}))
        config_store.forget()

    yield write
    config_store.forget()


def test_without_a_rule_the_fused_kernels_run(rule_file):
    tensors, options = _call()
    launched = _launched(tensors, options)
    assert launched >= FUSED_KERNELS and not launched & CHAIN_KERNELS


@pytest.mark.parametrize(("rules", "chained"), [
    # The call: chunk 32, state 2 x 4 x 16 x 16 = 2048 elements.
    ({"chunk_state_passing": {"min_chunk": 32, "max_state": 2048}}, {"chunk_state", "state_passing"}),
    ({"chunk_state_passing_bwd": {"min_chunk": 16, "max_state": 4096}},
     {"chunk_scan_bwd_dstates", "state_passing_bwd"}),
    ({"chunk_state_passing": {"min_chunk": 64, "max_state": 4096}}, set()),  # chunks too short
    ({"chunk_state_passing": {"min_chunk": 32, "max_state": 2047}}, set()),  # state too large
])
def test_the_rule_picks_each_pass_by_chunk_size_and_state(rule_file, rules, chained):
    rule_file(rules)
    tensors, options = _call()
    launched = _launched(tensors, options)
    assert launched & CHAIN_KERNELS == chained
    for stage, chain in CHAINS.items():  # each pass runs one way: fused, or as its chain
        assert (stage in launched) == (not chain <= chained)


def test_a_gpu_without_a_file_of_its_own_takes_the_chain_rule_of_the_gpu_serving_its_configs(
        rule_file, tmp_path, monkeypatch):
    """The configs and the chain rule come from the same file: a GPU of the same architecture's."""
    config_store.save(tmp_path / "tuned-gpu.yaml", config_store.ConfigFile(
        fingerprint={"compute_capability": "9.0"},
        selection={"chunk_state_passing": {"chain": {"min_chunk": 32, "max_state": 2048}}}))
    config_store.forget()
    tensors, options = _call()
    monkeypatch.setattr(fused_paths, "device_capability", lambda _device: "9.0")
    assert _launched(tensors, options) & CHAIN_KERNELS == CHAINS["chunk_state_passing"]
    monkeypatch.setattr(fused_paths, "device_capability", lambda _device: "8.0")
    assert not _launched(tensors, options) & CHAIN_KERNELS


def test_the_chain_gives_the_fused_results_forward_and_backward():
    """Packed documents, initial states and final states: every output and gradient agrees."""
    tensors, options = _call()
    with fused_paths.forced(fused_paths.FWD, "fused"), fused_paths.forced(fused_paths.BWD, "fused"):
        fused = _results(tensors, options)[0]
    with fused_paths.forced(fused_paths.FWD, "chain"), fused_paths.forced(fused_paths.BWD, "chain"):
        chain = _results(tensors, options)[0]
    assert fused.keys() == chain.keys()
    for name in fused:
        torch.testing.assert_close(chain[name], fused[name], atol=1e-4, rtol=1e-4, msg=name)


def test_forcing_takes_only_known_stages_and_paths():
    with pytest.raises(ValueError, match="expected a stage"), fused_paths.forced("bmm_chunk", "chain"):
        pass
    with pytest.raises(ValueError, match="and a path"), fused_paths.forced(fused_paths.FWD, "split"):
        pass


@pytest.mark.parametrize(("rule", "fused"), [
    (None, False),  # no rule: the chain, as before the fusion
    ({"max_heads_per_group": 2}, True),  # the call: 4 heads in 2 groups
    ({"max_heads_per_group": 1}, False),
])
@pytest.mark.parametrize(("stage", "fused_kernels", "chain_kernels", "phase"), [
    ("chunk_scan", set(), {"bmm_chunk"}, "forward"),  # chunk_scan makes cb itself
    ("chunk_bwd_db_dc", {"chunk_bwd_db_dc"}, DB_DC_CHAIN, "both"),  # dB and dC in one pass
    ("chunk_scan_bwd_dcb", set(), {"bmm_chunk"}, "backward"),  # the backward's dCB stage makes cb
    ("ssd_fused_fwd", {"ssd_fused_fwd"}, {"chunk_scan"}, "forward"),  # chunk_cumsum, then the rest in one launch
], ids=["chunk_scan", "chunk_bwd_db_dc", "chunk_scan_bwd_dcb", "ssd_fused_fwd"])
def test_each_fuse_rule_fuses_at_few_heads_per_group(rule_file, stage, fused_kernels, chain_kernels, phase, rule,
                                                     fused):
    rule_file({} if rule is None else {stage: rule}, kind="fuse")
    launched = _launched(*_call(), phase)
    assert launched.isdisjoint(chain_kernels) == fused
    assert launched >= (fused_kernels if fused else chain_kernels)


@pytest.mark.parametrize(("rules", "fused"), [
    ({}, False),  # no rule: chunk_cumsum, then the state pass, as before the fusion
    ({"chunk_cumsum_state_passing": {"fuse": {"max_heads_per_group": 2}}}, True),
    ({"chunk_cumsum_state_passing": {"fuse": {"max_heads_per_group": 1}}}, False),
    # the state pass chained (its two kernels): the cumsum has no pass to join
    ({"chunk_cumsum_state_passing": {"fuse": {"max_heads_per_group": 2}},
      "chunk_state_passing": {"chain": {"min_chunk": 32, "max_state": 2048}}}, False),
])
def test_the_fuse_rule_makes_dt_in_the_state_pass_where_that_pass_runs_fused(rule_file, tmp_path, rules, fused):
    config_store.save(tmp_path / "cpu.yaml", config_store.ConfigFile(selection=rules))
    config_store.forget()
    tensors, options = _call()
    launched = _launched(tensors, options)  # forward and the backward's recompute
    assert ("chunk_cumsum" not in launched) == fused



@pytest.mark.parametrize(("stage", "fused_kernel", "chain_kernels", "phase"), [
    ("chunk_scan", "chunk_scan", {"bmm_chunk"}, "forward"),  # the backward recomputes cb by bmm_chunk
    ("chunk_bwd_db_dc", "chunk_bwd_db_dc", DB_DC_CHAIN, "both"),
    ("chunk_cumsum_state_passing", "chunk_state_passing", {"chunk_cumsum"}, "both"),
    ("chunk_scan_bwd_dcb", "chunk_scan_bwd_dcb", {"bmm_chunk"}, "backward"),
    ("ssd_fused_fwd", "ssd_fused_fwd", {"chunk_scan", "chunk_state_passing"}, "forward"),
])
def test_each_fusion_gives_the_chains_results_forward_and_backward(stage, fused_kernel, chain_kernels, phase):
    """z, D per head dim, dt_bias with softplus and limits, packed documents, initial and final states: every
    output and gradient agrees."""
    tensors, options = _call()
    gen = torch.Generator().manual_seed(3)
    tensors = {**tensors, "z": torch.randn(tensors["x"].shape, generator=gen), "D": torch.randn(4, 16, generator=gen),
               "dt_bias": torch.randn(4, generator=gen)}
    options = {**options, "dt_softplus": True, "dt_limit": (0.02, 0.5)}
    with fused_paths.forced(stage, "fused"):
        fused, launched = _results(tensors, options)
    assert fused_kernel in launched[phase] and launched[phase].isdisjoint(chain_kernels)
    with fused_paths.forced(stage, "chain"):
        chain, launched = _results(tensors, options)
    assert chain_kernels <= launched[phase]
    for name in fused:
        torch.testing.assert_close(fused[name], chain[name], atol=1e-4, rtol=1e-4, msg=name)


def test_a_call_that_asks_for_varlen_states_takes_the_chain_that_has_the_states_in_hand():
    """The fused forward writes no per-chunk states, which the varlen states are made from."""
    gen = torch.Generator().manual_seed(11)
    x, dt = torch.randn(1, 80, 4, 16, generator=gen), torch.randn(1, 80, 4, generator=gen) * 0.5 - 3.0
    A, B, C = -torch.rand(4, generator=gen) - 0.5, torch.randn(1, 80, 2, 16, generator=gen), torch.randn(
        1, 80, 2, 16, generator=gen)
    cu_seqlens = torch.tensor([0, 20, 64, 80], dtype=torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(3, dtype=torch.int32), cu_seqlens.diff())[None]
    call = {"chunk_size": 32, "seq_idx": seq_idx, "cu_seqlens": cu_seqlens, "return_varlen_states": True}
    results = {}
    for path in ("fused", "chain"):
        with execution_mode("ref"), fused_paths.forced(fused_paths.ONE_PASS, path), capture_launches() as launches:
            results[path] = mamba2_kernels.mamba_chunk_scan_combined(x, dt, A, B, C, **call)
        assert "chunk_scan" in {kernel.name for kernel, _ in launches}
    for fused, chain in zip(results["fused"], results["chain"], strict=True):
        torch.testing.assert_close(fused, chain, atol=0, rtol=0)


def test_the_environment_forces_a_path_in_every_process_that_inherits_it(rule_file, monkeypatch):
    """How the fused path's own configs get tuned before a rule picks it: `MAMBA2_GUARD_PATHS=chunk_scan=fused
    mamba2-guard autotune ...`; a path forced in the thread still wins."""
    rule_file({})
    tensors, options = _call()
    monkeypatch.setenv("MAMBA2_GUARD_PATHS", "chunk_scan=fused, chunk_state_passing=chain")
    launched = _launched(tensors, options, "forward")
    assert "bmm_chunk" not in launched and {"chunk_state", "state_passing"} <= launched
    with fused_paths.forced(fused_paths.SCAN, "chain"):
        assert "bmm_chunk" in _launched(tensors, options, "forward")
    monkeypatch.setenv("MAMBA2_GUARD_PATHS", "chunk_scan=sideways")
    with pytest.raises(ValueError, match=r"\$MAMBA2_GUARD_PATHS: expected stage=path pairs.*'chunk_scan=sideways'"):
        _launched(tensors, options, "forward")
