"""Device peaks for roofline fractions, measured once per fingerprint and cached in the state dir."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from mamba2_guard.bench import timing
from mamba2_kernels.files import atomic_write, load_json

log = logging.getLogger(__name__)


def measure(device: str = "cuda") -> dict[str, Any]:
    return {
        "copy_bytes_per_s": timing.copy_bandwidth(device),
        "bf16_matmul_flops_per_s": timing.bf16_matmul_flops(device),
        "method": "median of 10 L2-flushed CUDA-event timings: 4 GiB device copy (read+write), 8192^3 bf16 matmul",
    }


def cached(state_dir: Path, fingerprint_digest: str, device: str = "cuda") -> dict[str, Any]:
    """The peaks cached for this fingerprint, else measured and cached; a cache that cannot be read (disk
    trouble, a hand edit) is measured again, not an error in every bench after it."""
    path = state_dir / "peaks" / f"{fingerprint_digest[:16]}.json"
    try:
        peaks = load_json(path)
        if isinstance(peaks, dict):
            return peaks
        log.warning("%s: expected a JSON object of device peaks; measuring them again", path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable device peaks (%s); measuring them again", path, exc)
    peaks = measure(device)
    atomic_write(path, json.dumps(peaks, indent=2, sort_keys=True) + "\n")
    return peaks


def roofline_fraction(bytes_moved: int, flops: int, median_ms: float | None, peaks: dict[str, Any]) -> float | None:
    """Time the roofline allows (the slower of memory and bf16 compute) over the time measured."""
    if not median_ms or not peaks:
        return None
    bound_s = max(bytes_moved / peaks["copy_bytes_per_s"], flops / peaks["bf16_matmul_flops_per_s"])
    return bound_s / (median_ms / 1e3)
