"""The guard's side of the seen-keys file: its metric, and ``autotune --seen``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from mamba2_kernels import registry, suites
from mamba2_kernels.tuning import capture_launches

ROOT = Path(__file__).resolve().parents[3]


def test_metrics_count_the_seen_keys_by_kernel_and_reason(seen_file, write_seen):
    from mamba2_guard.adapters.metrics import GuardMetrics

    write_seen(("gpu-a", "chunk_scan", "t=1"), ("gpu-a", "chunk_scan", "t=2"), ("gpu-a", "bmm_chunk", "t=2"))
    metrics = GuardMetrics()
    metrics.load_seen()
    text = metrics.exposition().decode()
    assert 'mamba2_guard_fallback_keys{kernel="chunk_scan",reason="related"} 2.0' in text
    assert 'mamba2_guard_fallback_keys{kernel="bmm_chunk",reason="related"} 1.0' in text
    seen_file.write_text("{}")
    metrics.load_seen()
    assert "mamba2_guard_fallback_keys{" not in metrics.exposition().decode()  # gone when tuned


def test_the_guard_cli_does_not_record_its_own_runs_as_seen(seen_file, monkeypatch):
    # Its nightly benches the zoo's held-out shapes on purpose: recorded, they would be re-tuned each night.
    from mamba2_guard import cli
    from mamba2_kernels import seen

    monkeypatch.setenv(seen.RECORD_ENV, "1")
    assert cli.main(["list", "--suite", "smoke"]) == 0
    assert os.environ[seen.RECORD_ENV] == "0"


def _launched(name, shape) -> set[tuple[str, str]]:
    """(kernel, key) of every Helion launch of the entry ``name`` at ``shape`` (CPU interpret mode)."""
    entry = registry.get(name)
    with capture_launches() as launches:
        entry.run_helion(entry.inputs(shape, 0, torch.device("cpu")))
    return {(kernel.name, str(kernel.shape_key(*args))) for kernel, args in launches}


def _autotune_seen(tmp_path, seen_file):
    fake = str(ROOT / "tests" / "guard" / "flows" / "fake_tuner.py") + ":tune"
    env = dict(os.environ, MAMBA2_GUARD_SEEN=str(seen_file))
    return subprocess.run([sys.executable, "-m", "mamba2_guard", "autotune", "--seen", "--tuner", fake, "--state-dir",
                           str(tmp_path / "state"), "--out", str(tmp_path / "out.yaml"), "--gpu-slug", "gpu-a",
                           "--budget-seconds", "5", "--workers", "1", "--no-rebaseline", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_autotune_seen_tunes_the_whole_call_at_each_seen_shape(tmp_path, seen_file, write_seen, monkeypatch):
    monkeypatch.setenv("HELION_INTERPRET", "1")  # the launches' keys are what is compared: Helion's ref mode
    done = _autotune_seen(tmp_path, seen_file)
    assert done.returncode == 0 and "nothing seen to tune on gpu-a" in done.stdout
    write_seen(("gpu-a", "chunk_scan", "t=1"))
    done = _autotune_seen(tmp_path, seen_file)
    plans = list((tmp_path / "state").glob("autotune/*/plan.json"))
    assert plans, done.stdout + done.stderr
    plan = json.loads(plans[0].read_text())
    (shape,) = {suites.load().shape(job.split("@")[1]) for job in plan["jobs"]}
    assert shape.name.startswith("seen-gpu-a-") and shape.z and shape.docs == 2  # the call's pattern (SEEN_CALL)
    # Every key the training job's call launched there is a key the planned jobs launch (and so search):
    # the per-stage entries' plain inputs launched others (seq=0 instead of the packed documents' seq=1).
    planned = {job.split("@")[0] for job in plan["jobs"]}
    by_entry = {name: _launched(name, shape) for name in planned | {"ssd_combined_fwd_bwd"}}
    assert by_entry["ssd_combined_fwd_bwd"] <= set().union(*(by_entry[name] for name in planned))
    # Keys that got a config since (another stage's job, an earlier run) are not searched again.
    assert plan["missing_only"] is True
    specs = list((tmp_path / "state").glob("autotune/*/jobs/*.spec.json"))
    assert specs and all(json.loads(path.read_text())["missing_only"] is True for path in specs)
