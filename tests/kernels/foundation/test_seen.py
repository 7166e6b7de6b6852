"""The seen-keys file: what a GPU served without its own tuned config, with the public call's shape."""

from __future__ import annotations

import json
import os

import pytest
import torch

from mamba2_kernels import config_store, seen
from mamba2_kernels.testing import execution_mode


@pytest.fixture
def seen_file(tmp_path, monkeypatch):
    file = tmp_path / "state" / "seen.json"
    monkeypatch.setenv("MAMBA2_GUARD_SEEN", str(file))
    return file


def test_a_fallback_is_recorded_once_per_process_with_the_call(seen_file):
    with seen.calling(batch=1, seqlen=64, nheads=4):
        seen.record("chunk_scan", "D=h,tokens=64", "nvidia-h200", "related", "D=h,tokens=128")
    seen.record("chunk_scan", "D=h,tokens=64", "nvidia-h200", "related", "D=h,tokens=128")
    (entry,) = seen.read(seen_file).values()
    assert entry["kernel"] == "chunk_scan" and entry["gpu"] == "nvidia-h200" and entry["reason"] == "related"
    assert entry["call"] == {"batch": 1, "seqlen": 64, "nheads": 4} and entry["processes"] == 2
    assert entry["first_seen"] <= entry["last_seen"]


def test_cpu_runs_and_off_record_nothing(seen_file, monkeypatch):
    seen.record("k", "t=1", "cpu", "default", None)
    assert not seen_file.exists()
    monkeypatch.setenv("MAMBA2_GUARD_SEEN", "off")
    seen.record("k", "t=1", "nvidia-h200", "default", None)
    assert seen.path() is None and not seen_file.exists()


def test_the_guards_own_processes_record_nothing(seen_file, monkeypatch):
    monkeypatch.setenv(seen.RECORD_ENV, "1")
    seen.stop_recording()
    seen.record("k", "t=1", "nvidia-h200", "default", None)
    assert not seen_file.exists()
    assert os.environ[seen.RECORD_ENV] == "0"  # inherited by the processes the guard starts


def test_a_broken_file_is_replaced_not_fatal(seen_file, caplog):
    seen_file.parent.mkdir(parents=True)
    seen_file.write_bytes(b"\xff\xfe{not json")
    with pytest.raises(ValueError, match="seen.json: not a readable seen-keys file"):
        seen.read(seen_file)
    with caplog.at_level("WARNING"):
        seen.record("k", "t=1", "nvidia-h200", "default", None)
    assert list(seen.read(seen_file)) == ["nvidia-h200|k|t=1"]
    assert any("starting it afresh" in r.message for r in caplog.records)


def test_the_file_keeps_the_newest_entries_only(seen_file, monkeypatch):
    monkeypatch.setattr(seen, "MAX_ENTRIES", 3)
    for i in range(5):
        seen.record("k", f"t={i}", "nvidia-h200", "default", None)
    assert sorted(seen.read(seen_file)) == [f"nvidia-h200|k|t={i}" for i in (2, 3, 4)]


def test_an_unwritable_place_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("MAMBA2_GUARD_SEEN", str(blocker / "seen.json"))  # under a file: cannot exist
    with caplog.at_level("WARNING"):
        seen.record("k", "t=1", "nvidia-h200", "default", None)
    assert any("could not record the fallback" in r.message for r in caplog.records)


@pytest.fixture
def first_calls():
    """Every tuned kernel dispatches afresh: a key an earlier test ran is cached, and a cached dispatch is not
    a fallback again (the record is once per process)."""
    from mamba2_kernels._runtime import TUNED_KERNELS

    for kernel in TUNED_KERNELS.values():
        kernel.forget_dispatch()


def test_the_whole_call_records_its_shape_for_forward_and_backward_kernels(seen_file, monkeypatch, smoke_shape,
                                                                          first_calls):
    """No config file for this GPU: every kernel falls back, and each entry carries the public call's shape,
    the backward's too (autograd runs it outside the forward's block)."""
    from mamba2_kernels import registry

    monkeypatch.setenv("MAMBA2_GUARD_GPU_SLUG", "gpu-without-configs")
    monkeypatch.setattr(config_store, "_warned", set())
    entry = registry.get("ssd_combined_fwd_bwd")
    shape = smoke_shape.replace(z=True, docs=2)
    with execution_mode("ref"):
        entry.run_helion(entry.inputs(shape, 0, torch.device("cpu")))
    entries = seen.read(seen_file).values()
    kernels = {e["kernel"] for e in entries}
    assert {"chunk_scan", "chunk_scan_chunk_state_bwd_dx", "chunk_scan_bwd_dz"} <= kernels
    expected = {"batch": 1, "seqlen": 96, "nheads": 4, "headdim": 16, "ngroups": 2, "dstate": 16, "chunk_size": 32,
                "dtype": "float32", "call": {"z": True, "docs": 2, "D": "h", "initial_states": False}}
    assert all(e["call"] == expected and e["reason"] == "default" for e in entries)
    assert json.loads(seen_file.read_text())  # plain JSON a person can read


def test_the_layer_records_its_shape_and_the_seen_suite_tunes_every_key_it_fell_back_at(seen_file, monkeypatch,
                                                                                        smoke_shape, first_calls):
    """Mamba2's memory-efficient path calls the layer, not the SSD call: its fallbacks (conv and norm too) carry
    the layer's shape, whose seen suite shape the planned entries (``registry.seen_entries``) cover."""
    from mamba2_kernels import registry, suites
    from mamba2_kernels._runtime import capture_launches

    monkeypatch.setenv("MAMBA2_GUARD_GPU_SLUG", "gpu-without-configs")
    monkeypatch.setattr(config_store, "_warned", set())
    entry = registry.get("mamba2_layer_fwd_bwd")
    with execution_mode("ref"):
        entry.run_helion(entry.inputs(smoke_shape.replace(docs=2), 0, torch.device("cpu")))
    recorded = {(e["kernel"], e["key"]) for e in seen.read(seen_file).values()}
    assert {"causal_conv1d_fwd", "causal_conv1d_bwd", "gated_rmsnorm_fwd", "gated_rmsnorm_bwd", "chunk_scan",
            "chunk_scan_chunk_state_bwd_dx"} <= {kernel for kernel, _ in recorded}
    loaded = suites.load()
    (name,) = loaded.suites[suites.SEEN_SUITE]
    shape = loaded.shape(name)
    assert (shape.docs, shape.norm_group_size, shape.conv_width) == (2, smoke_shape.norm_group_size, 4)
    launched = set()
    for planned in registry.seen_entries(kernel for kernel, _ in recorded):
        with capture_launches() as launches, execution_mode("ref"):
            registry.get(planned).run_helion(registry.get(planned).inputs(shape, 0, torch.device("cpu")))
        launched |= {(kernel.name, str(kernel.shape_key(*args))) for kernel, args in launches}
    assert recorded <= launched
