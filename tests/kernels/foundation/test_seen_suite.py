"""The seen suite: the public calls that fell back, as suite shapes the guard can bench and tune."""

from __future__ import annotations

import pytest

from mamba2_kernels import config_store, suites
from mamba2_kernels.config_store import ConfigFile


def test_each_call_is_one_shape_with_the_keys_it_fell_back_at(seen_file, write_seen):
    write_seen(("gpu-a", "chunk_scan", "t=1"), ("gpu-a", "bmm_chunk", "t=2"), ("gpu-b", "chunk_scan", "t=1"),
               ("gpu-a", "x", "t=3", None))  # no call shape: left out
    loaded = suites.load()
    names = loaded.suites[suites.SEEN_SUITE]
    assert len(names) == 2 and all(n.startswith(("seen-gpu-a-", "seen-gpu-b-")) for n in names)
    (on_a,) = suites.seen_on(loaded, "gpu-a")
    assert (on_a.nheads, on_a.z, on_a.docs, on_a.norm_group_size) == (4, True, 2, 64)
    assert sorted(loaded.seen_keys[on_a.name]) == [("bmm_chunk", "t=2"), ("chunk_scan", "t=1")]
    assert suites.seen_on(loaded, "gpu-c") == []


def test_a_call_leaves_the_re_tune_once_all_its_keys_are_tuned(seen_file, write_seen, tmp_path):
    write_seen(("gpu-a", "chunk_scan", "t=1"), ("gpu-a", "bmm_chunk", "t=2"))
    config_store.save(config_store.path_for("gpu-a", tmp_path / "configs"),
                      ConfigFile(kernels={"chunk_scan": {"t=1": {"num_warps": 4}}}))
    assert len(suites.seen_on(suites.load(), "gpu-a")) == 1  # bmm_chunk's key is still untuned
    config_store.save(config_store.path_for("gpu-a", tmp_path / "configs"), ConfigFile(
        kernels={"chunk_scan": {"t=1": {"num_warps": 4}}, "bmm_chunk": {"t=2": {"num_warps": 2}}}))
    loaded = suites.load()
    assert suites.seen_on(loaded, "gpu-a") == [] and loaded.suites[suites.SEEN_SUITE]  # still a shape


def test_an_unreadable_seen_file_leaves_the_suite_out_and_says_why(seen_file, write_seen):
    seen_file.write_text("[1, 2")
    loaded = suites.load()
    assert suites.SEEN_SUITE not in loaded.suites
    assert loaded.seen_problem.startswith(f"{seen_file}: not a readable seen-keys file")


def test_an_empty_seen_suite_says_so_rather_than_unknown(seen_file, monkeypatch):
    """`list --suite seen` before any fallback: the suite is named empty, with the file it reads."""
    with pytest.raises(KeyError, match=rf"suite 'seen' is empty: {seen_file} records no call that fell back"):
        suites.load().suite(suites.SEEN_SUITE)
    monkeypatch.setenv("MAMBA2_GUARD_SEEN", "off")
    with pytest.raises(KeyError, match=r"suite 'seen' is empty: \$MAMBA2_GUARD_SEEN is off"):
        suites.load().suite(suites.SEEN_SUITE)
    with pytest.raises(KeyError, match="unknown suite 'sean'; valid suites: default"):
        suites.load().suite("sean")
