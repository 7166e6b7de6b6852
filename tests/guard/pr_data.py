"""The PR bot's test data: fingerprints, config and baseline documents, and git helpers, shared by the adapter,
core and flow tests of the PR path (their fixtures are in ``tests/guard/conftest.py``)."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import yaml

TOKEN = "ghp_FAKEtoken0123456789abcdefSECRETxyz"
HUMAN = {
    "GIT_AUTHOR_NAME": "Alice Human",
    "GIT_AUTHOR_EMAIL": "alice@example.com",
    "GIT_COMMITTER_NAME": "Alice Human",
    "GIT_COMMITTER_EMAIL": "alice@example.com",
}

FP_OLD = {
    "gpu_name": "NVIDIA H200",
    "gpu_uuid": "GPU-1111",
    "compute_capability": "9.0",
    "sm_count": 132,
    "memory_bytes": 150_000_000_000,
    "driver_version": "580.159.04",
    "cuda_runtime": "12.8",
    "torch": "2.11.0",
    "triton": "3.5.0",
    "helion": "1.4.0",
    "mamba_ssm": "2.3.2",
    "python": "3.11.7",
    "kernels_source_hash": "a" * 64,
    "kernel_sources": {"mamba2_kernels/ssd/chunk_scan.py": "1" * 64, "mamba2_kernels/norm/rmsnorm.py": "2" * 64},
}
FP_NEW = {**FP_OLD, "helion": "1.5.0", "triton": "3.6.0"}

KEY_4K = "chunk_size=256,dstate=128,dtype=bfloat16,headdim=64,tokens=4096"
KEY_16K = "chunk_size=256,dstate=128,dtype=bfloat16,headdim=64,tokens=16384"
CONFIGS_OLD = {
    "fingerprint": FP_OLD,
    "tuned": {"date": "2026-01-01", "effort": "quick", "seed": 1, "budget_s": 600},
    "kernels": {
        "ssd_chunk_scan_fwd": {
            KEY_4K: {"block_sizes": [64, 32], "num_warps": 4, "num_stages": 3},
            KEY_16K: {"block_sizes": [64, 64], "num_warps": 4, "num_stages": 2},
        },
        "rmsnorm_gated_fwd": {"dtype=bfloat16,group_size=1024": {"block_sizes": [1024], "num_warps": 8}},
    },
}


def baseline_doc(fp, helion_ms=0.5, mamba_ms=0.6):
    results = {}
    for kernel, shapes in CONFIGS_OLD["kernels"].items():
        results[kernel] = {
            s: {
                "helion": {"median_ms": helion_ms},
                "mamba_ssm": {"median_ms": mamba_ms},
                "speedup_vs_mamba_ssm": mamba_ms / helion_ms,
                "precision": {
                    "max_rel_err_vs_fp64": 1e-3,
                    "max_abs_diff_vs_mamba_ssm": 2e-4,
                    "mean_abs_diff_vs_mamba_ssm": 1e-4,
                    "allclose": True,
                    "finite": True,
                },
            }
            for s in shapes
        }
    return {"fingerprint": fp, "results": results}


def new_configs(num_warps=8, seed=7):
    doc = copy.deepcopy(CONFIGS_OLD)
    doc["fingerprint"] = FP_NEW
    doc["tuned"] = {"date": "2026-02-01", "effort": "full", "seed": seed, "budget_s": 3600}
    doc["kernels"]["ssd_chunk_scan_fwd"][KEY_4K]["num_warps"] = num_warps
    return doc


def dump(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=True))


def git(cwd: Path, *args: str, env: dict | None = None) -> str:
    full_env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", **HUMAN, **(env or {})}
    return subprocess.run(
        ["git", *args], cwd=cwd, env=full_env, check=True, capture_output=True, text=True
    ).stdout.strip()
