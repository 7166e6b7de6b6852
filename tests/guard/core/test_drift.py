"""Drift classification: one test per class, plus policy and report rendering."""

from __future__ import annotations

import json

import pytest

from mamba2_guard.core.drift import DriftPolicy, classify
from tests.guard.pr_data import FP_OLD


def test_no_drift():
    rep = classify(FP_OLD, FP_OLD, FP_OLD, {})
    assert not rep.found and rep.items == () and rep.action == "ignore"
    assert "No drift" in rep.render_text()
    # A different physical card of the same model is not drift.
    rep = classify({**FP_OLD, "gpu_uuid": "GPU-2222", "hostname": "other"}, FP_OLD, FP_OLD, {})
    assert not rep.found


def test_new_gpu_when_no_configs():
    rep = classify(FP_OLD, None, None, {})
    assert rep.found and rep.action == "retune" and rep.classes == ("new-gpu",)
    (item,) = rep.by_class("new-gpu")
    assert item.after == "NVIDIA H200" and item.before is None


def test_no_gpu_is_not_a_new_gpu():
    cpu = {**FP_OLD, "gpu_name": None, "gpu_uuid": None, "sm_count": None, "memory_bytes": None}
    rep = classify(cpu, None, None, {})
    assert not rep.by_class("new-gpu") and not rep.found
    assert any("no GPU" in note for note in rep.notes)


def test_new_gpu_when_configs_were_tuned_on_another_model():
    recorded = {**FP_OLD, "gpu_name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "memory_bytes": 85_000_000_000}
    rep = classify(FP_OLD, recorded, None, {})
    (item,) = rep.by_class("new-gpu")
    assert "memory_bytes" in item.detail and rep.action == "retune"


def test_software_one_item_per_component_with_before_after():
    cur = {**FP_OLD, "helion": "1.5.0", "triton": "3.6.0", "driver_version": "590.1"}
    rep = classify(cur, FP_OLD, FP_OLD, {})
    items = {i.component: i for i in rep.by_class("software")}
    assert set(items) == {"helion", "triton", "driver"}
    assert (items["helion"].before, items["helion"].after) == ("1.4.0", "1.5.0")
    assert (items["driver"].before, items["driver"].after) == ("580.159.04", "590.1")
    assert all(i.action == "retune" and i.reference == ("configs", "baseline") for i in items.values())
    assert rep.action == "retune" and rep.classes == ("software",)


def test_software_change_by_source_hash_only():
    old = {**FP_OLD, "helion_source_hash": "b" * 64}
    cur = {**FP_OLD, "helion_source_hash": "c" * 64}
    rep = classify(cur, old, old, {})
    (item,) = rep.by_class("software")
    assert item.component == "helion" and item.before == "b" * 64 and item.after == "c" * 64
    assert "version 1.4.0 unchanged" in item.detail
    # Nested layout is understood too.
    rep2 = classify(
        {**FP_OLD, "source_hashes": {"torch": "x1"}}, {**FP_OLD, "source_hashes": {"torch": "x0"}}, None, {}
    )
    assert [i.component for i in rep2.by_class("software")] == ["torch"]


def test_mamba_ssm_change_only_rebaselines():
    rep = classify({**FP_OLD, "mamba_ssm": "2.3.3"}, FP_OLD, FP_OLD, {})
    (item,) = rep.items
    assert item.cls == "software" and item.component == "mamba_ssm" and item.action == "rebaseline"
    assert rep.action == "rebaseline" and rep.found


def test_change_seen_only_against_baseline_is_at_most_rebaseline():
    # Configs already tuned under helion 1.5, baseline still from 1.4.
    cur = {**FP_OLD, "helion": "1.5.0"}
    rep = classify(cur, cur, FP_OLD, {})
    (item,) = rep.items
    assert item.reference == ("baseline",) and item.action == "rebaseline"


def test_kernel_source_names_changed_files():
    cur = {
        **FP_OLD,
        "kernels_source_hash": "f" * 64,
        "kernel_sources": {"mamba2_kernels/ssd/chunk_scan.py": "9" * 64, "mamba2_kernels/conv/conv1d.py": "3" * 64},
    }
    rep = classify(cur, FP_OLD, FP_OLD, {})
    (item,) = rep.by_class("kernel-source")
    assert item.files == (
        "mamba2_kernels/conv/conv1d.py (added)",
        "mamba2_kernels/norm/rmsnorm.py (removed)",
        "mamba2_kernels/ssd/chunk_scan.py (changed)",
    )
    assert item.action == "retune"
    # Without per-file hashes the class is still found, with a note.
    bare_old = {k: v for k, v in FP_OLD.items() if k != "kernel_sources"}
    rep = classify({**bare_old, "kernels_source_hash": "e" * 64}, bare_old, None, {})
    (item,) = rep.by_class("kernel-source")
    assert item.files == () and "not recorded" in item.detail


def test_a_change_of_host_code_alone_leaves_the_configs_valid():
    # The selection rule's weights (config_store.py) changed in a guard upgrade: a re-tune would search for
    # what it found before, so the kernel-source drift asks at most for a new baseline; a kernel's change,
    # with or beside host code, still asks for a re-tune.
    def changed(*paths):
        sources = dict(FP_OLD["kernel_sources"])
        sources.update({path: "7" * 64 for path in paths})
        return {**FP_OLD, "kernels_source_hash": "f" * 64, "kernel_sources": sources}

    host = frozenset({"mamba2_kernels/config_store.py"})
    (item,) = classify(changed("mamba2_kernels/config_store.py"), FP_OLD, FP_OLD, {}, host_sources=host).items
    assert item.action == "rebaseline" and "host code only" in item.detail
    (item,) = classify(changed("mamba2_kernels/config_store.py"), FP_OLD, FP_OLD, {}).items
    assert item.action == "retune"
    both = changed("mamba2_kernels/config_store.py", "mamba2_kernels/ssd/chunk_scan.py")
    (item,) = classify(both, FP_OLD, FP_OLD, {}, host_sources=host).items
    assert item.action == "retune" and len(item.files) == 2


def test_invalid_config():
    errors = {("ssd_chunk_scan_fwd", "hd64_L4k"): "block_sizes[0]=512 exceeds max 256"}
    rep = classify(FP_OLD, FP_OLD, FP_OLD, errors)
    (item,) = rep.items
    assert item.cls == "invalid-config" and item.kernel == "ssd_chunk_scan_fwd" and item.shape_key == "hd64_L4k"
    assert "exceeds" in item.detail and rep.action == "retune"
    assert "ssd_chunk_scan_fwd/hd64_L4k" in rep.render_text()


def test_policy_from_mapping_and_strongest_action():
    policy = DriftPolicy.from_mapping({"software": {"driver": "ignore", "helion": "rebaseline"},
                                       "kernel_source": "ignore"})
    cur = {**FP_OLD, "driver_version": "590.1", "helion": "1.5.0", "kernels_source_hash": "f" * 64}
    rep = classify(cur, FP_OLD, FP_OLD, {}, policy=policy)
    actions = {i.component: i.action for i in rep.items}
    assert actions == {"driver": "ignore", "helion": "rebaseline", "kernels": "ignore"}
    assert rep.action == "rebaseline" and rep.found
    # Everything ignored -> found is False but items are still reported.
    quiet = DriftPolicy.from_mapping({"software": "ignore"})
    rep = classify({**FP_OLD, "torch": "2.12"}, FP_OLD, FP_OLD, {}, policy=quiet)
    assert not rep.found and len(rep.items) == 1 and "ignored" in rep.render_text()
    with pytest.raises(ValueError):
        DriftPolicy.from_mapping({"softwares": "retune"})
    with pytest.raises(ValueError):
        DriftPolicy.from_mapping({"new-gpu": "rebuild"})
    with pytest.raises(ValueError):
        DriftPolicy.from_mapping({"software": {"numpy": "retune"}})


def test_report_to_dict_is_json_and_complete():
    cur = {**FP_OLD, "helion": "1.5.0", "kernels_source_hash": "f" * 64}
    rep = classify(cur, FP_OLD, FP_OLD, {("k", "s"): "bad"})
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["found"] is True and d["action"] == "retune"
    assert d["classes"] == ["software", "kernel-source", "invalid-config"]
    assert [i["class"] for i in d["items"]] == ["software", "kernel-source", "invalid-config"]
    assert "helion 1.4.0 -> 1.5.0" in rep.summary()
