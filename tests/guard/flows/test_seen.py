"""The guard's side of the seen-keys file: its metric, and ``autotune --seen``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import config_store

ROOT = Path(__file__).resolve().parents[3]
CALL = {"batch": 1, "seqlen": 96, "nheads": 4, "headdim": 16, "ngroups": 2, "dstate": 16, "chunk_size": 32,
        "dtype": "float32", "call": {"z": True, "docs": 2, "D": "h", "initial_states": False}}


def _entry(gpu, kernel, key):
    return {f"{gpu}|{kernel}|{key}": {"gpu": gpu, "kernel": kernel, "key": key, "reason": "related", "call": CALL}}


@pytest.fixture
def seen_file(tmp_path, monkeypatch):
    file = tmp_path / "seen.json"
    monkeypatch.setenv("MAMBA2_GUARD_SEEN", str(file))
    monkeypatch.setattr(config_store, "CONFIG_DIR", tmp_path / "configs")
    config_store._cache.clear()
    return file


def test_metrics_count_the_seen_keys_by_kernel_and_reason(seen_file):
    from guard.adapters.metrics import GuardMetrics

    seen_file.write_text(json.dumps({**_entry("gpu-a", "chunk_scan", "t=1"), **_entry("gpu-a", "chunk_scan", "t=2"),
                                     **_entry("gpu-a", "bmm_chunk", "t=2")}))
    metrics = GuardMetrics()
    metrics.load_seen()
    text = metrics.exposition().decode()
    assert 'mamba2_guard_fallback_keys{kernel="chunk_scan",reason="related"} 2.0' in text
    assert 'mamba2_guard_fallback_keys{kernel="bmm_chunk",reason="related"} 1.0' in text
    seen_file.write_text("{}")
    metrics.load_seen()
    assert "mamba2_guard_fallback_keys{" not in metrics.exposition().decode()  # gone when tuned


def _autotune_seen(tmp_path, seen_file):
    fake = str(ROOT / "tests" / "guard" / "flows" / "fake_tuner.py") + ":tune"
    env = dict(os.environ, MAMBA2_GUARD_SEEN=str(seen_file))
    return subprocess.run([sys.executable, "-m", "guard", "autotune", "--seen", "--tuner", fake, "--state-dir",
                           str(tmp_path / "state"), "--out", str(tmp_path / "out.yaml"), "--gpu-slug", "gpu-a",
                           "--budget-seconds", "5", "--workers", "1", "--no-rebaseline", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_autotune_seen_tunes_the_whole_call_at_each_seen_shape(tmp_path, seen_file):
    done = _autotune_seen(tmp_path, seen_file)
    assert done.returncode == 0 and "nothing seen to tune on gpu-a" in done.stdout
    seen_file.write_text(json.dumps(_entry("gpu-a", "chunk_scan", "t=1")))
    done = _autotune_seen(tmp_path, seen_file)
    plans = list((tmp_path / "state").glob("autotune/*/plan.json"))
    assert plans, done.stdout + done.stderr
    plan = json.loads(plans[0].read_text())
    text = json.dumps(plan)
    assert "seen-gpu-a-" in text and "chunk_scan_chunk_state_bwd_dx" in text
