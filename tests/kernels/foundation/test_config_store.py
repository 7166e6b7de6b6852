"""Config store: round trip, stable output, the lookup rule, and errors that name the file and key."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mamba2_kernels import config_store
from mamba2_kernels.config_store import ConfigFile, ConfigFileError, ShapeKey

names = st.sampled_from(["chunk_state", "chunk_scan", "state_passing", "gated_rmsnorm_bwd"])
exact_fields = st.fixed_dictionaries({
    "dtype": st.sampled_from(["bfloat16", "float16", "float32"]),
    "headdim": st.sampled_from([32, 64, 80, 128]),
    "dstate": st.sampled_from([16, 64, 96, 128]),
})
keys = st.builds(lambda exact, tokens: ShapeKey.of(**exact, tokens=tokens), exact_fields,
                 st.sampled_from([2 ** k for k in range(4, 20)]))
configs = st.fixed_dictionaries({
    "block_sizes": st.lists(st.sampled_from([16, 32, 64, 128]), min_size=1, max_size=3),
    "num_warps": st.sampled_from([1, 2, 4, 8]),
    "num_stages": st.integers(1, 5),
    "pid_type": st.sampled_from(["flat", "xyz", "persistent_blocked"]),
})
weights = st.fixed_dictionaries({"flag": st.sampled_from([0.0, 0.5, 1.0, 4.0]), "tile": st.sampled_from([0.5, 2.0]),
                                 "size": st.sampled_from([0.25, 0.5, 1.0])},
                                optional={"headdim": st.sampled_from([0.5, 2.0, 8.0]),
                                          "fitted_on": st.integers(1, 40), "regret": st.floats(1.0, 3.0)})
files = st.builds(
    ConfigFile,
    fingerprint=st.fixed_dictionaries({"gpu_name": st.just("NVIDIA H200"), "helion": st.sampled_from(["1.5.0"])}),
    tuned=st.fixed_dictionaries({"seed": st.integers(0, 2 ** 31), "effort": st.sampled_from(["quick", "full"])}),
    kernels=st.dictionaries(names, st.dictionaries(keys.map(str), configs, max_size=5), max_size=4),
    selection=st.dictionaries(names, weights, max_size=2),
)


@settings(max_examples=60, deadline=None)
@given(files)
def test_round_trip_is_identity_and_text_is_stable(tmp_path_factory, cf):
    path = tmp_path_factory.mktemp("cfg") / "nvidia-h200.yaml"
    config_store.save(path, cf)
    loaded = config_store.load(path)
    assert loaded == cf
    assert config_store.dumps(loaded) == path.read_text()  # saving again changes nothing


@settings(max_examples=60, deadline=None)
@given(files)
def test_one_config_per_line(cf):
    text = config_store.dumps(cf)
    config_lines = [line for line in text.splitlines() if line.startswith("    ")]
    assert len(config_lines) == sum(len(v) for v in cf.kernels.values())


def _oracle_distance(a: ShapeKey, b: ShapeKey, w: config_store.Weights) -> float:
    """The rule as the docs state it, written out field by field."""
    da, db = dict(a.fields), dict(b.fields)
    total = 0.0
    sizes, tiles = ("tokens", "channels", "nheads", "hpg"), ("headdim", "dstate", "k", "chunk_size", "group_size",
                                                             "width", "dim")
    for name in set(da) | set(db):
        if da.get(name) == db.get(name):
            continue
        both = name in da and name in db
        if name in sizes and both:
            total += w.size * abs(math.log2(da[name] / db[name]))
        elif name in tiles and both:
            padded = abs(math.ceil(math.log2(da[name])) - math.ceil(math.log2(db[name])))
            weight = w.headdim if name == "headdim" else w.tile
            total += weight * (padded + abs(math.log2(da[name] / db[name]))) / 2
        else:
            total += w.flag
    return total


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, configs, min_size=1, max_size=8), keys, weights)
def test_lookup_rule(stored, query, rule):
    cf = ConfigFile(kernels={"k": {str(k): c for k, c in stored.items()}}, selection={"k": rule})
    w = config_store.Weights.from_dict(rule)
    found = config_store.find(cf, "k", query)
    if query in stored:
        assert (found.source, found.key, found.config) == ("exact", str(query), stored[query])
        return
    # never the default while the kernel has any stored config: the nearest by the fitted weights
    used = ShapeKey.parse(found.key)
    best = min(_oracle_distance(query, k, w) for k in stored)
    assert math.isclose(_oracle_distance(query, used, w), best)
    assert found.key == min(str(k) for k in stored if math.isclose(_oracle_distance(query, k, w), best))
    assert found.source == ("nearest" if used.code() == query.code() else "related")
    assert found.config == stored[used]


@settings(max_examples=200, deadline=None)
@given(keys, keys, weights)
def test_distance_is_symmetric_and_zero_only_for_the_same_key(a, b, rule):
    w = config_store.Weights.from_dict(rule)
    assert math.isclose(a.distance(b, w), b.distance(a, w))
    assert (a.distance(b, config_store.Weights()) == 0) == (a == b)


def test_a_tile_extent_is_nearest_the_one_whose_padded_tiles_it_shares():
    # headdim 80 runs in 128-wide tiles: the config of headdim 128 is nearer than that of 64, though 80 / 64 is
    # the smaller ratio; between powers of two the ratio alone counts
    stored = {ShapeKey.of(dtype="bfloat16", headdim=h, tokens=8192): {"block_sizes": [h]} for h in (64, 128)}
    cf = ConfigFile(kernels={"k": {str(k): c for k, c in stored.items()}})
    assert config_store.find(cf, "k", ShapeKey.of(dtype="bfloat16", headdim=80, tokens=8192)).config == {
        "block_sizes": [128]}
    assert config_store.tile_doublings(80, 128) < config_store.tile_doublings(80, 64)
    assert config_store.tile_doublings(64, 256) == 2.0


def test_the_exact_key_comes_first_when_zero_weights_tie_it_with_another():
    stored = {str(ShapeKey.of(dtype=dtype, headdim=32, tokens=16)): {"block_sizes": [size]}
              for dtype, size in (("bfloat16", 16), ("float16", 32))}
    cf = ConfigFile(kernels={"k": stored}, selection={"k": {"flag": 0.0, "tile": 2.0, "size": 0.5}})
    found = config_store.find(cf, "k", ShapeKey.of(dtype="float16", headdim=32, tokens=16))
    assert (found.source, found.config) == ("exact", {"block_sizes": [32]})


def test_size_fields_do_not_change_the_code_part_of_a_key():
    a = ShapeKey.of(dtype="bfloat16", headdim=64, hpg=8, nheads=64, tokens=16384, z=1)
    b = ShapeKey.of(dtype="bfloat16", headdim=64, hpg=80, nheads=80, tokens=8192, z=1)
    assert a.code() == b.code() == (("dtype", "bfloat16"), ("headdim", 64), ("z", 1))
    assert ShapeKey.of(dtype="bfloat16", headdim=128, hpg=8, nheads=64, tokens=16384, z=1).code() != a.code()


_TIED_CONFIG = {"block_sizes": [16], "num_warps": 1, "num_stages": 1, "pid_type": "flat"}


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, configs, min_size=1, max_size=8), keys)
# two keys at the same distance, which the rule and the oracle compute with different rounding
@example({ShapeKey.of(dstate=16, dtype="bfloat16", headdim=32, tokens=16): _TIED_CONFIG,
          ShapeKey.of(dstate=16, dtype="float16", headdim=64, tokens=64): _TIED_CONFIG},
         ShapeKey.of(dstate=96, dtype="bfloat16", headdim=80, tokens=16))
@example({ShapeKey.of(dstate=ds, dtype="bfloat16", headdim=80, tokens=t): _TIED_CONFIG
          for ds, t in ((16, 2048), (64, 524288))},
         ShapeKey.of(dstate=64, dtype="bfloat16", headdim=128, tokens=32))
def test_candidates_are_every_stored_key_nearest_first(stored, query):
    cf = ConfigFile(kernels={"k": {str(k): c for k, c in stored.items()}})
    ranked = config_store.candidates(cf, "k", query)
    w = config_store.Weights()
    assert sorted(found.key for found in ranked) == sorted(str(k) for k in stored)
    # nearest first by the oracle; keys at the same distance (up to rounding) by their text
    ranked_keys = [ShapeKey.parse(found.key) for found in ranked]
    for near, far in itertools.pairwise(ranked_keys):
        d_near, d_far = _oracle_distance(query, near, w), _oracle_distance(query, far, w)
        if math.isclose(d_near, d_far):
            assert str(near) < str(far)
        else:
            assert d_near < d_far
    assert config_store.candidates(cf, "other", query) == []
    assert config_store.find(cf, "other", query) == config_store.Lookup(None, "default", None)


def test_by_default_a_config_of_the_calls_own_headdim_serves_before_one_of_its_own_chunk_size():
    """The whole call's chunk-256 launches at headdim 64 on a new GPU: tuned keys at chunk 128 and headdim 64,
    and at chunk 256 and headdim 80 (128-wide tiles). The first fits their tiles; by the default weights it
    serves."""
    call = ShapeKey.of(chunk_size=256, dstate=64, headdim=64, hpg=80, tokens=8192)
    own_headdim = ShapeKey.of(chunk_size=128, dstate=256, headdim=64, hpg=32, tokens=8192)
    own_chunk = ShapeKey.of(chunk_size=256, dstate=128, headdim=80, hpg=16, tokens=8192)
    cf = ConfigFile(kernels={"chunk_scan": {str(own_headdim): {"block_sizes": [64]},
                                            str(own_chunk): {"block_sizes": [128]}}})
    assert [found.key for found in config_store.candidates(cf, "chunk_scan", call)] == [
        str(own_headdim), str(own_chunk)]


def test_stored_candidates_and_fallbacks_counted_always_logged_once(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(config_store, "_warned", set())
    key = ShapeKey.of(dtype="bfloat16", headdim=64, tokens=16384)
    other = ShapeKey.of(dtype="bfloat16", headdim=64, tokens=8192)
    config_store.save(config_store.path_for("test-gpu", tmp_path), ConfigFile(kernels={"k": {str(other): {
        "num_warps": 4}}}))
    ranked = config_store.stored_candidates("k", key, "test-gpu", tmp_path)
    assert [(found.source, found.config) for found in ranked] == [("nearest", {"num_warps": 4})]
    assert config_store.stored_candidates("other", key, "test-gpu", tmp_path) == []
    assert config_store.stored_candidates("k", key, "no-such-gpu", tmp_path) == []
    before = config_store.FALLBACKS[("k", "nearest")]
    with caplog.at_level("WARNING"):
        for _ in range(2):
            config_store.note_fallback("k", str(key), "test-gpu", "nearest", ranked[0].key)
    assert config_store.FALLBACKS[("k", "nearest")] == before + 2
    assert sum("no tuned config" in r.message for r in caplog.records) == 1  # logged once, counted always


def _gpu_file(config_dir, slug, capability, kernels):
    config_store.save(config_store.path_for(slug, config_dir),
                      ConfigFile(fingerprint={"compute_capability": capability}, kernels=kernels))


def test_a_gpu_without_configs_of_a_kernel_takes_a_same_architecture_gpus(tmp_path):
    """An H100 beside the H200's file: the H200's configs, marked other-gpu, rather than Helion's default;
    among several, the same compute capability first; another architecture's never; its own file first."""
    config_store.forget()
    key = ShapeKey.of(dtype="bfloat16", headdim=64, tokens=16384)
    _gpu_file(tmp_path, "a-gpu-90", "9.0", {"k": {str(key): {"num_warps": 4}}})
    _gpu_file(tmp_path, "b-gpu-9a", "9.1", {"k": {str(key): {"num_warps": 8}}})
    _gpu_file(tmp_path, "c-gpu-100", "10.0", {"k": {str(key): {"num_warps": 2}}})

    def served(capability, slug="new-gpu"):
        return [(found.source, found.gpu, found.used, found.config["num_warps"])
                for found in config_store.stored_candidates("k", key, slug, tmp_path, capability=capability)]

    assert served("9.0") == [("other-gpu", "a-gpu-90", f"a-gpu-90:{key}", 4)]
    assert served("9.1") == [("other-gpu", "b-gpu-9a", f"b-gpu-9a:{key}", 8)]
    assert served("10.0") == [("other-gpu", "c-gpu-100", f"c-gpu-100:{key}", 2)]
    assert served("8.0") == served(None) == []
    assert [slug for slug, _ in config_store.borrowable_files("new-gpu", "9.1", tmp_path)] == ["b-gpu-9a", "a-gpu-90"]
    assert served("9.0", slug="b-gpu-9a") == [("exact", None, str(key), 8)]  # its own file comes first
    _gpu_file(tmp_path, "new-gpu", "9.0", {"other": {str(key): {"num_warps": 1}}})
    config_store.forget()
    assert served("9.0") == [("other-gpu", "a-gpu-90", f"a-gpu-90:{key}", 4)]  # its file lacks the kernel


def test_an_unreadable_file_of_another_gpu_is_skipped_with_a_warning(tmp_path, caplog):
    config_store.forget()
    key = ShapeKey.of(dtype="bfloat16", tokens=16384)
    (tmp_path / "broken-gpu.yaml").write_text("kernels: [not, a, mapping]\n")
    _gpu_file(tmp_path, "good-gpu", "9.0", {"k": {str(key): {"num_warps": 4}}})
    with caplog.at_level("WARNING"):
        found = config_store.stored_candidates("k", key, "new-gpu", tmp_path, capability="9.0")
    assert [f.gpu for f in found] == ["good-gpu"]
    assert any("broken-gpu.yaml" in r.message for r in caplog.records)


def test_channels_are_a_size_field_so_another_channel_count_finds_the_nearest_config():
    """The conv's key: mamba2-default's 4352 channels fall back to a config tuned at 6144, not to Helion's
    default; a different layout (a flag) takes the nearest config of the other layout as related."""
    tuned = {str(ShapeKey.of(channels_last=1, channels=6144, tokens=16384)): {"block_sizes": [256, 512]},
             str(ShapeKey.of(channels_last=1, channels=1024, tokens=16384)): {"block_sizes": [64, 64]}}
    cf = ConfigFile(kernels={"conv": tuned})
    found = config_store.find(cf, "conv", ShapeKey.of(channels_last=1, channels=4352, tokens=16384))
    assert (found.source, found.config) == ("nearest", {"block_sizes": [256, 512]})
    other_layout = config_store.find(cf, "conv", ShapeKey.of(channels_last=0, channels=6144, tokens=16384))
    assert (other_layout.source, other_layout.config) == ("related", {"block_sizes": [256, 512]})
    with pytest.raises(ValueError, match="channels"):
        ShapeKey.of(channels=0, tokens=16384)


@pytest.mark.parametrize(("text", "where"), [
    ("kernels: [1, 2]\n", "kernels: expected a mapping"),
    ("kernels:\n  chunk_state: 3\n", "kernels.chunk_state: expected a mapping"),
    ("kernels:\n  chunk_state:\n    notakey: {}\n", "kernels.chunk_state.notakey: bad shape key"),
    ("kernels:\n  chunk_state:\n    a=1: [1]\n", "kernels.chunk_state.a=1: expected a mapping"),
    ("surprise: 1\n", "unknown top-level key(s) ['surprise']"),
    ("selection: [1]\n", "selection: expected a mapping"),
    ("selection:\n  chunk_scan: 3\n", "selection.chunk_scan: expected a mapping"),
    ("selection:\n  chunk_scan: {flag: -1}\n", "selection.chunk_scan.flag: expected a weight >= 0"),
    ("selection:\n  chunk_scan: {size: .inf}\n", "selection.chunk_scan.size: expected a weight >= 0"),
    ("selection:\n  chunk_state_passing: {chain: 3}\n", "selection.chunk_state_passing.chain: expected a mapping"),
    ("selection:\n  chunk_state_passing: {chain: {min_chunk: 256}}\n",
     "selection.chunk_state_passing.chain.max_state: expected a positive integer, got None"),
    ("selection:\n  chunk_state_passing: {chain: {min_chunk: 0, max_state: 9}}\n",
     "selection.chunk_state_passing.chain.min_chunk: expected a positive integer, got 0"),
    ("selection:\n  chunk_scan: {fuse: 3}\n",
     "selection.chunk_scan.fuse.max_heads_per_group: expected a positive integer, got None"),
    ("selection:\n  chunk_scan: {fuse: {max_heads_per_group: 0}}\n",
     "selection.chunk_scan.fuse.max_heads_per_group: expected a positive integer, got 0"),
    ("fingerprint: 3\n", "fingerprint: expected a mapping"),
    ("kernels: {a: [\n", "not valid YAML"),
])
def test_malformed_files_name_file_and_key(tmp_path, text, where):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as info:
        config_store.load(path)
    assert str(path) in str(info.value) and where in str(info.value)


def test_a_file_not_in_utf8_is_named(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_bytes(b"kernels: \xff\n")
    with pytest.raises(ConfigFileError, match=f"{path}: not valid YAML"):
        config_store.load(path)


def test_save_is_atomic_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "gpu.yaml"
    config_store.save(path, ConfigFile(kernels={"k": {"a=1": {"num_warps": 4}}}))
    before = path.read_text()

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(config_store.os, "replace", explode)
    with pytest.raises(OSError):
        config_store.save(path, ConfigFile(kernels={"k": {"a=1": {"num_warps": 8}}}))
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.yaml"]  # no temp file left behind




def test_slugify():
    assert config_store.slugify("NVIDIA H200") == "nvidia-h200"
    assert config_store.slugify("NVIDIA B200") == "nvidia-b200"
    assert config_store.slugify("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    with pytest.raises(ValueError, match="gpu_name"):
        config_store.slugify("  ")


def test_shape_key_parse_and_errors():
    key = ShapeKey.of(dtype="bfloat16", headdim=64, tokens=16384)
    assert ShapeKey.parse(str(key)) == key
    with pytest.raises(ValueError, match="name=value"):
        ShapeKey.parse("headdim64")
    with pytest.raises(ValueError, match="tokens"):
        ShapeKey.of(tokens=0)
    assert config_store.tokens_bucket(16384) == 16384 and config_store.tokens_bucket(16385) == 32768


def test_the_committed_config_files_name_only_kernels_that_exist():
    from mamba2_kernels import registry

    known = registry.tuned_kernel_names()
    for path in sorted(config_store.CONFIG_DIR.glob("*.yaml")):
        assert set(config_store.load(path).kernels) <= known, path


def test_the_serving_file_is_looked_at_again_after_a_while_and_at_once_after_a_save_here(tmp_path, monkeypatch):
    """The fused stages ask for their rule at every call; a stat of the file each time cost more host time than a
    small shape's kernels. A file written by another process shows within RECHECK_SECONDS, one saved here at once."""
    config_store.forget()
    clock = [100.0]
    monkeypatch.setattr(config_store.time, "monotonic", lambda: clock[0])
    path = config_store.path_for("a-gpu", tmp_path)

    def rule_file(heads: int) -> ConfigFile:
        return ConfigFile(selection={"chunk_scan": {"fuse": {"max_heads_per_group": heads}}})

    def served() -> int | None:
        cf = config_store.serving_file("a-gpu", None, tmp_path)
        return None if cf is None else cf.fuse_rule("chunk_scan").max_heads_per_group

    config_store.save(path, rule_file(4))
    assert served() == 4
    path.write_text(config_store.dumps(rule_file(8)))  # another process's write
    clock[0] += config_store.RECHECK_SECONDS / 2
    assert served() == 4
    clock[0] += config_store.RECHECK_SECONDS / 2
    assert served() == 8
    config_store.save(path, rule_file(16))
    assert served() == 16
    path.unlink()
    clock[0] += config_store.RECHECK_SECONDS
    assert served() is None
    assert config_store.serving_file("a-gpu", None, tmp_path / "elsewhere") is None  # another directory, looked at
