"""Device peaks for roofline fractions, measured once per fingerprint and cached in the state dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from guard.bench import timing
from kernels.config_store import atomic_write


def measure(device: str = "cuda") -> dict[str, Any]:
    return {
        "copy_bytes_per_s": timing.copy_bandwidth(device),
        "bf16_matmul_flops_per_s": timing.bf16_matmul_flops(device),
        "method": "median of 10 L2-flushed CUDA-event timings: 4 GiB device copy (read+write), 8192^3 bf16 matmul",
    }


def cached(state_dir: Path, fingerprint_digest: str, device: str = "cuda") -> dict[str, Any]:
    path = state_dir / "peaks" / f"{fingerprint_digest[:16]}.json"
    if path.exists():
        return json.loads(path.read_text())
    peaks = measure(device)
    atomic_write(path, json.dumps(peaks, indent=2, sort_keys=True) + "\n")
    return peaks


def roofline_fraction(bytes_moved: int, flops: int, median_ms: float | None, peaks: dict[str, Any]) -> float | None:
    """Time the roofline allows (the slower of memory and bf16 compute) over the time measured."""
    if not median_ms or not peaks:
        return None
    bound_s = max(bytes_moved / peaks["copy_bytes_per_s"], flops / peaks["bf16_matmul_flops_per_s"])
    return bound_s / (median_ms / 1e3)
