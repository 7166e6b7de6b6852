"""Fitting the config-selection rule: the best config per grid key, and weights by leave-one-out regret."""

from __future__ import annotations

import json
import math

import pytest

from mamba2_guard.core import selection_fit
from mamba2_guard.flows.selection_measure import apply_fit, key_distance, read_records
from mamba2_kernels import config_store
from mamba2_kernels.config_store import ConfigFile


def _k(dstate: int, tokens: int, z: int = 0) -> str:
    return f"dstate={dstate},tokens={tokens},z={z}"


def test_the_best_config_at_each_key_is_the_fastest():
    row = selection_fit.Measured("k", _k(64, 8192), {"a": 1.0, "b": 0.5, "c": 0.7})
    assert row.best() == "b"


def test_weights_follow_the_field_that_decides_which_config_wins():
    """Configs here transfer across token counts but not across dstate: the fitted rule must weigh dstate
    (a tile field) over tokens (a size field), where a rule that ranks tokens first loses time."""
    fast_small, fast_large = {"s": 1.0, "l": 2.0}, {"s": 2.0, "l": 1.0}
    rows = [selection_fit.Measured("k", _k(64, t), fast_small) for t in (1024, 65536)]
    rows += [selection_fit.Measured("k", _k(256, t), fast_large) for t in (2048, 131072)]
    size_first = {"flag": 1.0, "tile": 0.5, "size": 2.0}
    assert selection_fit.loo_regret(rows, size_first, key_distance) > 1.0
    result = selection_fit.fit(rows, key_distance)
    assert result.regret == pytest.approx(1.0)
    assert result.fitted_on == 4 and result.best[_k(256, 2048)] == "l"
    assert math.isclose(selection_fit.loo_regret(rows, result.weights, key_distance), result.regret)


def test_headdim_is_weighed_apart_from_the_other_tile_fields():
    """Configs here fit their headdim and transfer across chunk sizes. With headdim weighed as the other tile
    fields, a left-out key takes the config of the other headdim at its own chunk size (one doubling) over
    that of its own headdim at a chunk size two doublings away, and loses time; the fit weighs headdim more."""
    def key(headdim: int, chunk: int) -> str:
        return f"chunk_size={chunk},headdim={headdim},tokens=8192"
    rows = [selection_fit.Measured("k", key(headdim, chunk), {"64": 1.0, "128": 2.0} if headdim == 64 else
                               {"64": 2.0, "128": 1.0}) for headdim in (64, 128) for chunk in (64, 256)]
    alike = {**selection_fit.DEFAULT_WEIGHTS, "headdim": selection_fit.DEFAULT_WEIGHTS["tile"]}
    assert selection_fit.loo_regret(rows, alike, key_distance) == pytest.approx(2.0)
    assert selection_fit.loo_regret(rows, selection_fit.DEFAULT_WEIGHTS, key_distance) == pytest.approx(1.0)
    result = selection_fit.fit(rows, key_distance)
    assert result.regret == pytest.approx(1.0)
    assert result.weights["headdim"] > 2 * result.weights["tile"]


def test_a_stored_key_timed_under_another_name_counts_as_that_candidate():
    """Configs that adapt to the same candidate at a grid key are timed once, under the first key's name. The
    left-out key's nearest stored key here is such an alias: its time is the candidate's, not a gap that sends
    the rule on to a farther key."""
    near, far = _k(64, 2048), _k(64, 65536)
    row = selection_fit.Measured("k", _k(64, 1024), {"first": 1.0, far: 3.0}, aliases={near: "first"})
    weights = selection_fit.DEFAULT_WEIGHTS
    assert selection_fit.loo_regret([row], weights, key_distance, stored=[near, far]) == pytest.approx(1.0)
    unaliased = selection_fit.Measured("k", row.key, row.ms)
    assert selection_fit.loo_regret([unaliased], weights, key_distance, stored=[near, far]) == pytest.approx(3.0)


def test_the_fit_knows_the_rule_s_weights_and_their_defaults():
    """mamba2_guard.core stays pure, so it writes the rule's weights out again; they must be the config store's."""
    assert config_store.Weights().as_dict() == selection_fit.DEFAULT_WEIGHTS
    assert tuple(selection_fit.WEIGHT_LADDER) == config_store.WEIGHT_NAMES


def test_ties_keep_the_default_weights():
    rows = [selection_fit.Measured("k", _k(64, t), {"a": 1.0}) for t in (1024, 4096)]
    assert selection_fit.fit(rows, key_distance).weights == selection_fit.DEFAULT_WEIGHTS


def test_one_kernel_per_fit():
    with pytest.raises(ValueError, match="one kernel"):
        selection_fit.fit([selection_fit.Measured("a", _k(64, 1), {"x": 1.0}),
                           selection_fit.Measured("b", _k(64, 1), {"x": 1.0})], key_distance)


def test_apply_fit_stores_grid_winners_without_replacing_tuned_configs(tmp_path):
    tuned = {_k(128, 16384): {"num_warps": 4}, _k(64, 8192): {"num_warps": 8}}
    cf = ConfigFile(kernels={"k": dict(tuned)})
    records = [
        {"kernel": "k", "key": _k(64, 8192), "ms": {_k(128, 16384): 1.0},
         "configs": {_k(128, 16384): {"num_warps": 4}}, "aliases": {}},
        {"kernel": "k", "key": _k(256, 8192), "ms": {_k(128, 16384): 2.0, _k(64, 8192): 1.0},
         "configs": {_k(128, 16384): {"num_warps": 4}, _k(64, 8192): {"num_warps": 8}}, "aliases": {}},
    ]
    new, fits = apply_fit(cf, records)
    assert new.kernels["k"][_k(64, 8192)] == {"num_warps": 8}  # tuned there: kept
    assert new.kernels["k"][_k(256, 8192)] == {"num_warps": 8}  # the grid key's winner
    assert set(new.selection["k"]) == {"flag", "tile", "size", "headdim", "fitted_on", "regret"}
    assert [f.kernel for f in fits] == ["k"]


def test_a_broken_measurement_file_is_named(tmp_path):
    path = tmp_path / "m.jsonl"
    kernel = {"shape": "a", "kernel": "k", "key": "x=1", "ms": {}, "configs": {}, "aliases": {}}
    path.write_text(json.dumps(kernel) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"m\.jsonl: line 2: not a JSON measurement record"):
        read_records(path)
    # A record without a field the fit reads is named, not a KeyError's traceback.
    path.write_text(json.dumps(kernel) + "\n" + json.dumps({"shape": "a", "stage": "s", "chunk_size": 256}) + "\n")
    with pytest.raises(ValueError, match=r"m\.jsonl: line 2: expected a stage record with shape, stage, "
                                         r"chunk_size, state, ms; it lacks state, ms"):
        read_records(path)
    # A kernel record written before aliases were recorded would bias the fit: refused, by name.
    path.write_text(json.dumps({k: v for k, v in kernel.items() if k != "aliases"}) + "\n")
    with pytest.raises(ValueError, match=r"m\.jsonl: line 1: expected a kernel record .*; it lacks aliases"):
        read_records(path)
    with pytest.raises(ValueError, match="cannot read the measurements"):
        read_records(tmp_path / "missing.jsonl")


def _path(chunk: int, state: int, fused: float, chain: float, stage: str = "s") -> selection_fit.PathMeasured:
    return selection_fit.PathMeasured(stage, chunk, state, fused, chain)


def test_the_chain_rule_chains_long_chunks_with_small_states():
    """The chain wins below a state size at chunk 256 and nowhere at chunk 128: the rule says so, with the
    threshold at the geometric midpoint between the last win and the first loss."""
    rows = [_path(256, 1 << 18, 1.0, 0.8), _path(256, 1 << 20, 1.0, 0.9), _path(256, 1 << 22, 1.0, 1.2),
            _path(128, 1 << 18, 1.0, 1.3), _path(128, 1 << 22, 1.0, 1.1)]
    result = selection_fit.fit_chain(rows)
    assert result.rule == {"min_chunk": 256, "max_state": 1 << 21}
    assert result.regret == pytest.approx(1.0) and result.fused_regret > 1.05
    assert result.selection_entry() == {"min_chunk": 256, "max_state": 1 << 21, "fitted_on": 5}
    assert "chain at chunk >= 256 and state <= 2097152" in result.describe()


def test_where_the_fused_kernel_wins_or_ties_there_is_no_chain_rule():
    assert selection_fit.fit_chain([_path(256, 1 << 18, 1.0, 1.1), _path(128, 1 << 20, 1.0, 1.0)]).rule is None
    result = selection_fit.fit_chain([_path(256, 1 << 18, 1.0, 1.0)])
    assert result.rule is None and result.selection_entry() is None and "fused everywhere" in result.describe()


def test_one_stage_per_chain_fit():
    with pytest.raises(ValueError, match="one stage"):
        selection_fit.fit_chain([_path(256, 1, 1.0, 1.0, "a"), _path(256, 1, 1.0, 1.0, "b")])
    with pytest.raises(ValueError, match="no measurements"):
        selection_fit.fit_chain([])


def test_apply_fit_writes_chain_rules_beside_the_weights(tmp_path):
    weights = {"flag": 1.0, "tile": 2.0, "size": 0.5}
    cf = ConfigFile(selection={"chunk_state_passing": dict(weights),
                               "chunk_state_passing_bwd": {"chain": {"min_chunk": 64, "max_state": 10}}})
    records = [{"shape": "a", "stage": stage, "chunk_size": 256, "state": 1 << 18, "ms": {"fused": 1.0, "chain": chain}}
               for stage, chain in (("chunk_state_passing", 0.5), ("chunk_state_passing_bwd", 2.0))]
    new, fits = apply_fit(cf, records)
    assert new.selection["chunk_state_passing"] == {**weights, "chain": {"min_chunk": 256, "max_state": 1 << 18,
                                                                          "fitted_on": 1}}
    assert "chunk_state_passing_bwd" not in new.selection  # the fused kernel won: the old rule goes
    assert new.chain_rule("chunk_state_passing").chains(256, 1 << 18)
    assert [f.stage for f in fits] == ["chunk_state_passing", "chunk_state_passing_bwd"]
    path = tmp_path / "c.yaml"
    config_store.save(path, new)
    assert config_store.load(path).selection == new.selection


def _scan(heads_per_group: int, fused: float, chain: float) -> selection_fit.PathMeasured:
    return selection_fit.PathMeasured("chunk_scan", 128, 1, fused, chain, heads_per_group)


def test_the_fuse_rule_fuses_up_to_the_heads_per_group_where_fusing_won():
    """Each head recomputes its group's cb when fused: fusing wins at few heads per group and loses at many."""
    rows = [_scan(1, 0.8, 1.0), _scan(2, 0.9, 1.0), _scan(8, 1.2, 1.0), _scan(16, 1.3, 1.0)]
    result = selection_fit.fit_fuse(rows)
    assert result.rule == {"max_heads_per_group": 2}
    assert result.regret == pytest.approx(1.0) and result.chain_regret > 1.05
    assert result.selection_entry() == {"max_heads_per_group": 2, "fitted_on": 4}
    assert "fused at heads per group <= 2" in result.describe()
    tie = selection_fit.fit_fuse([_scan(1, 1.0, 1.0), _scan(8, 1.1, 1.0)])
    assert tie.rule is None and tie.selection_entry() is None and "chain everywhere" in tie.describe()
    with pytest.raises(ValueError, match="fit_fuse: no measurements"):
        selection_fit.fit_fuse([])


def test_apply_fit_writes_the_fuse_rule_beside_chunk_scans_weights():
    weights = {"flag": 0.05, "tile": 0.5, "size": 0.125}
    cf = ConfigFile(selection={"chunk_scan": dict(weights)})
    records = [{"shape": shape, "stage": "chunk_scan", "chunk_size": 128, "state": 1, "heads_per_group": hpg,
                "ms": {"fused": fused, "chain": 1.0}} for shape, hpg, fused in (("a", 1, 0.7), ("b", 8, 1.4))]
    new, fits = apply_fit(cf, records)
    assert new.selection["chunk_scan"] == {**weights, "fuse": {"max_heads_per_group": 1, "fitted_on": 2}}
    assert new.fuse_rule("chunk_scan").fuses(1) and not new.fuse_rule("chunk_scan").fuses(2)
    assert new.chain_rule("chunk_scan") is None and [f.stage for f in fits] == ["chunk_scan"]
