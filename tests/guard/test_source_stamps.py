"""What the repository commits is self-consistent: each config file and baseline records the kernel sources of
this checkout, and ``mamba2-guard dev restamp`` re-stamps only the kernels named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mamba2_guard.adapters.fingerprint import collect, combined_hash, kernel_source_hashes
from mamba2_guard.bench.timing import measured_under
from mamba2_guard.core.drift import changed_kernel_files
from mamba2_guard.core.results import BenchResult

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted((REPO / "mamba2_kernels" / "configs").glob("*.yaml")) + sorted((REPO / "baselines").glob("*.yaml"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_committed_files_record_the_current_kernel_sources(path):
    recorded = yaml.safe_load(path.read_text())["fingerprint"]
    stale = sorted(changed_kernel_files(recorded, {"kernel_sources": kernel_source_hashes()}))
    assert not stale, (f"{path.relative_to(REPO)} records other sources of {', '.join(stale)}: re-validate those "
                       f"kernels' configs, then `mamba2-guard dev restamp --gpu-slug {path.stem} --kernels ...`")
    assert recorded["kernels_source_hash"] == combined_hash(recorded["kernel_sources"])


def test_restamp_stamps_only_the_kernels_named(tmp_path):
    for rel in ("mamba2_kernels/configs/nvidia-h200.yaml", "baselines/nvidia-h200.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        doc = yaml.safe_load((REPO / rel).read_text())
        for name in ("ssd/chunk_cumsum.py", "norm/gated_rmsnorm.py"):  # two kernels "changed since"
            doc["fingerprint"]["kernel_sources"][name] = "0" * 64
        (tmp_path / rel).write_text(yaml.safe_dump(doc))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([str(Path(sys.executable).parent / "mamba2-guard"), "dev", "restamp", "--gpu-slug",
                           "nvidia-h200", "--kernels", "chunk_cumsum", "--root", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    for rel in ("mamba2_kernels/configs/nvidia-h200.yaml", "baselines/nvidia-h200.yaml"):
        recorded = yaml.safe_load((tmp_path / rel).read_text())["fingerprint"]
        changed = changed_kernel_files(recorded, {"kernel_sources": kernel_source_hashes()})
        assert not any(c.startswith("ssd/chunk_cumsum.py") for c in changed), rel
        assert "norm/gated_rmsnorm.py (changed)" in changed, rel


def test_one_fingerprint_hash_for_the_cli_and_the_report():
    fp = collect()
    assert BenchResult(fingerprint=measured_under(fp.to_dict()), cases=()).fingerprint_hash == fp.digest()
    assert fp.kernel_sources and fp.kernel_sources == kernel_source_hashes()
