"""The nightly cycle under failure: what is checked before the bench, what is kept after it."""

from __future__ import annotations

import os
import time

import pytest

from mamba2_guard import EXIT_BUSY
from mamba2_guard.adapters.history import History
from mamba2_guard.flows import nightly
from mamba2_guard.flows.nightly import CycleOptions, run_cycle

OPTIONS = CycleOptions(shapes=("smoke",), kernels=("chunk_cumsum",), confirm=False, pr=False)


def test_a_failure_after_the_bench_keeps_the_result_and_report_and_records_no_run(tmp_path, monkeypatch):
    state = tmp_path / "state"

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device", str(state / "latest.json"))

    monkeypatch.setattr(nightly, "export_metrics", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run_cycle(state, OPTIONS)
    assert len(list((state / "reports").glob("*-result.json"))) == 1
    assert len(list((state / "reports").glob("*-report.md"))) == 1
    with History(state / "history.sqlite") as history:
        assert history.runs() == []  # the cycle did not finish: no "pass" recorded


def test_stale_temp_files_of_interrupted_writes_are_cleaned_at_start(tmp_path):
    state = tmp_path / "state"
    root = tmp_path / "root"
    old, fresh = time.time() - 3600, time.time()
    stale = [state / ".latest.json.abc123.tmp", state / "reports" / ".x-report.md.def.tmp",
             root / "baselines" / ".cpu.yaml.ghi.tmp", root / "mamba2_kernels" / "configs" / ".cpu.yaml.jkl.tmp"]
    live = state / ".daemon-state.json.mno.tmp"  # a concurrent writer's: too young to be stale
    for path in [*stale, live]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("torn")
        os.utime(path, (old, old) if path in stale else (fresh, fresh))
    messages: list[str] = []
    run_cycle(state, CycleOptions(shapes=("smoke",), kernels=("chunk_cumsum",), confirm=False, pr=False,
                                  root=str(root)), progress=messages.append)
    assert not any(p.exists() for p in stale) and live.exists()
    assert sum("left by an interrupted write" in m for m in messages) == len(stale)


def test_a_daemon_cycle_finding_the_state_dir_busy_is_skipped(tmp_path):
    from filelock import FileLock

    state = tmp_path / "state"
    state.mkdir()
    with FileLock(str(state / "nightly.lock")):  # a CLI nightly holds it
        assert nightly.daemon_cycle(state, shapes=("smoke",), kernels=("chunk_cumsum",)) == EXIT_BUSY


@pytest.mark.parametrize(("overrides", "on_gpu", "benched"), [
    ({}, True, True),
    ({}, False, False),  # CPU: the smoke suite alone
    ({"suite": "smoke"}, True, False),
    ({"shapes": ("nemotron3-nano",)}, True, False),
    ({"kernels": ("chunk_scan",)}, True, False),
])
def test_a_gpu_nightly_of_the_default_suite_benches_the_zoos_whole_calls(overrides, on_gpu, benched):
    from mamba2_guard.flows.nightly import ZOO_ENTRIES, CycleOptions, zoo_selection
    from mamba2_kernels import suites

    entries, shapes = zoo_selection(CycleOptions(**overrides), on_gpu)
    if not benched:
        assert (entries, shapes) == ([], [])
        return
    assert [e.name for e in entries] == list(ZOO_ENTRIES)
    loaded = suites.load()
    assert {s.name for s in shapes} == {s.name for name in ("zoo-steered", "zoo-fit") for s in loaded.suite(name)}


def test_a_nightly_retunes_seen_shapes_with_the_whole_call():
    # A nightly restricted to chunk_scan still tunes the keys training jobs hit: the whole call's launches.
    from mamba2_guard.flows.nightly import retune_plan
    from mamba2_kernels import registry, suites

    loaded = suites.load()
    smoke, seen = loaded.shape("smoke"), loaded.shape("nemotron3-nano-packed")
    kernels, shapes = retune_plan(registry.select(["chunk_scan"]), [smoke], [seen, smoke])
    assert kernels == ["chunk_scan", "ssd_combined_fwd", "ssd_combined_fwd_bwd"]
    assert [s.name for s in shapes] == ["smoke", "nemotron3-nano-packed"]
    assert retune_plan(registry.select(["chunk_scan"]), [smoke], []) == (["chunk_scan"], [smoke])
    # A layer's call fell back at its conv too: the layer's entries tune it (only they launch it so).
    kernels, _ = retune_plan(registry.select(["chunk_scan"]), [smoke], [seen], ["chunk_scan", "causal_conv1d_fwd"])
    assert kernels == ["chunk_scan", "ssd_combined_fwd", "ssd_combined_fwd_bwd", "mamba2_layer_fwd",
                       "mamba2_layer_fwd_bwd"]


def test_a_nightly_with_a_torn_seen_file_says_it_and_finishes(tmp_path, seen_file):
    # What was seen is unknown: the cycle goes on (its bench is still worth having) and says why no seen
    # call is re-tuned, naming the file.
    seen_file.write_text("[1, 2")
    messages: list[str] = []
    run_cycle(tmp_path / "state", OPTIONS, progress=messages.append)
    (warning,) = [m for m in messages if str(seen_file) in m]
    assert "not a readable seen-keys file" in warning and "not re-tuned" in warning


def test_an_unknown_kernel_name_in_a_config_file_is_named(tmp_path, caplog):
    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.flows.nightly import detect_drift
    from mamba2_kernels import config_store
    from mamba2_kernels.config_store import ConfigFile

    config_store.save(tmp_path / "mamba2_kernels" / "configs" / "gpu-a.yaml", ConfigFile(kernels={
        "chunk_scan": {"t=1": {"num_warps": 4}}, "chunk_scna": {"t=1": {"num_warps": 4}}}))
    with caplog.at_level("WARNING"):
        detect_drift(fingerprint.collect(), root=tmp_path, gpu_slug="gpu-a")
    (warning,) = [r.message for r in caplog.records if "unknown kernel name" in r.message]
    assert "gpu-a.yaml: kernels: unknown kernel name(s) chunk_scna," in warning and "chunk_scan," not in warning


def test_drift_names_the_configs_an_untuned_gpu_borrows(tmp_path):
    """An H100 beside only the H200's file: drift finds a new GPU and says its jobs run on the H200's configs
    (the runtime's other-gpu rule), not on Helion's defaults; another architecture borrows nothing."""
    import dataclasses

    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.flows.nightly import detect_drift
    from mamba2_kernels import config_store
    from mamba2_kernels.config_store import ConfigFile

    config_store.save(tmp_path / "mamba2_kernels" / "configs" / "nvidia-h200.yaml", ConfigFile(
        fingerprint={"gpu_name": "NVIDIA H200", "compute_capability": "9.0"},
        kernels={"chunk_scan": {"t=1": {"num_warps": 4}}}))
    h100 = dataclasses.replace(fingerprint.collect(), gpu_name="NVIDIA H100 80GB HBM3", compute_capability="9.0")
    report = detect_drift(h100, root=tmp_path)
    assert report.classes == ("new-gpu",)
    assert [n for n in report.notes if "nvidia-h200's" in n] == [
        "until this GPU's configs are tuned, its jobs run on nvidia-h200's (same architecture, compute capability 9.0)"]
    # Two borrowable files: each kernel runs on the first that holds it, so both are named, in that order;
    # one holding no config serves nothing.
    for slug, kernels in (("nvidia-gh200", {"bmm_chunk": {"t=1": {"num_warps": 4}}}), ("nvidia-h100-empty", {})):
        config_store.save(tmp_path / "mamba2_kernels" / "configs" / f"{slug}.yaml", ConfigFile(
            fingerprint={"gpu_name": slug, "compute_capability": "9.0"}, kernels=kernels))
    assert [n for n in detect_drift(h100, root=tmp_path).notes if "jobs run on" in n] == [
        "until this GPU's configs are tuned, its jobs run on nvidia-gh200's and nvidia-h200's (for each kernel, "
        "the first of these with a config of it) (same architecture, compute capability 9.0)"]
    a100 = dataclasses.replace(h100, gpu_name="NVIDIA A100-SXM4-80GB", compute_capability="8.0")
    assert not [n for n in detect_drift(a100, root=tmp_path).notes if "jobs run on" in n]
    assert not [n for n in detect_drift(h100, root=tmp_path, gpu_slug="nvidia-h200").notes if "jobs run on" in n]


def test_the_pr_step_comes_after_the_history_and_the_metrics(tmp_path, monkeypatch):
    """A PR step that never returns (a remote that hangs, then a kill) loses neither the night's history row nor
    its metrics: they are written first."""
    state = tmp_path / "state"
    monkeypatch.setattr(nightly, "retune_or_bring_up", lambda *args, **kwargs: {"pr_due": {"dry": True}})

    def killed_while_pushing(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(nightly, "propose_configs", killed_while_pushing)
    with pytest.raises(KeyboardInterrupt):
        run_cycle(state, OPTIONS)
    with History(state / "history.sqlite") as history:
        assert [run["status"] for run in history.runs()] == ["pass"]
    assert (state / "latest.json").is_file()


def test_a_guard_upgrade_that_changed_host_code_alone_does_not_re_tune_the_gpus_configs(tmp_path):
    """The nightly's drift check weighs the checkout's real host sources: a runner's configs tuned before an
    upgrade that moved only the config store's rules stay; a kernel's change still calls for a re-tune."""
    import dataclasses

    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.flows.nightly import detect_drift
    from mamba2_kernels import config_store
    from mamba2_kernels.config_store import ConfigFile

    now = dataclasses.replace(fingerprint.collect(), gpu_name="NVIDIA H100 80GB HBM3", compute_capability="9.0")

    def drift_after(changed_file):
        tuned = {**now.to_dict(), "kernel_sources": {**now.kernel_sources, changed_file: "0" * 64}}
        tuned["kernels_source_hash"] = fingerprint.combined_hash(tuned["kernel_sources"])
        config_store.save(tmp_path / "mamba2_kernels" / "configs" / "gpu-a.yaml",
                          ConfigFile(fingerprint=tuned, kernels={"chunk_scan": {"t=1": {"num_warps": 4}}}))
        return detect_drift(now, root=tmp_path, gpu_slug="gpu-a")

    assert drift_after("config_store.py").action == "rebaseline"
    assert drift_after("ssd/chunk_scan.py").action == "retune"
