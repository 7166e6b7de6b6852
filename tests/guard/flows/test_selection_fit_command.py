"""``mamba2-guard fit-selection``: the rule and the grid's winners written into the config file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mamba2_kernels import config_store
from mamba2_kernels.config_store import ConfigFile

ROOT = Path(__file__).resolve().parents[3]


def _fit(tmp_path, measurements: Path, out: Path):
    return subprocess.run([sys.executable, "-m", "mamba2_guard", "fit-selection", str(measurements),
                           "--out", str(out), "--gpu-slug", "gpu-a"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_fit_writes_weights_and_grid_winners(tmp_path):
    tuned, grid = "dstate=128,tokens=16384", "dstate=64,tokens=8192"
    out = tmp_path / "gpu-a.yaml"
    config_store.save(out, ConfigFile(kernels={"chunk_scan": {tuned: {"num_warps": 4}}}))
    measurements = tmp_path / "m.jsonl"
    measurements.write_text(json.dumps({"shape": "s", "kernel": "chunk_scan", "key": grid, "ms": {tuned: 0.5},
                                        "errors": {}, "configs": {tuned: {"num_warps": 4}}, "aliases": {}}) + "\n")
    done = _fit(tmp_path, measurements, out)
    assert done.returncode == 0, done.stderr
    cf = config_store.load(out)
    assert cf.kernels["chunk_scan"] == {tuned: {"num_warps": 4}, grid: {"num_warps": 4}}
    assert cf.selection["chunk_scan"]["fitted_on"] == 1 and "chunk_scan: weights" in done.stdout


def test_a_broken_measurement_file_exits_2_naming_it(tmp_path):
    out = tmp_path / "gpu-a.yaml"
    config_store.save(out, ConfigFile())
    measurements = tmp_path / "m.jsonl"
    measurements.write_text("{oops\n")
    done = _fit(tmp_path, measurements, out)
    assert done.returncode == 2 and "m.jsonl: line 1: not a JSON measurement record" in done.stderr
    assert "Traceback" not in done.stderr and config_store.load(out) == ConfigFile()


def test_a_missing_config_file_exits_2_saying_which_to_give(tmp_path):
    measurements = tmp_path / "m.jsonl"
    measurements.write_text("")
    done = _fit(tmp_path, measurements, tmp_path / "gpu-a.yaml")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "gpu-a.yaml: no such config file" in done.stderr and "--gpu-slug" in done.stderr
    assert not (tmp_path / "gpu-a.yaml").exists()
    # the measurements are named first when both are missing
    missing = _fit(tmp_path, tmp_path / "none.jsonl", tmp_path / "gpu-a.yaml")
    assert missing.returncode == 2 and "none.jsonl: cannot read the measurements" in missing.stderr
