"""The fingerprint hash: the one identity of an environment.

It names the PR branch and marker, keys the history's windows (a new hash resets them), and stamps bench
results and baselines. ``mamba2_guard.adapters.fingerprint.Fingerprint.digest()`` is this hash of its dict.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

# The bench's timing method (mamba2_guard.bench.timing): results and baselines record it; it is in the fingerprint so
# that a result taken by another method starts a new history window. v2: warm-up by time, the head start,
# whole calls as graphs.
TIMING_METHOD = "v2"

# Keys that name a machine or a moment rather than an environment: two hosts with the same GPU model
# and software must produce the same fingerprint hash (and so the same branch).
VOLATILE_FINGERPRINT_KEYS = frozenset(
    {"gpu_uuid", "gpu_index", "hostname", "host", "collected_at", "timestamp", "date", "pci_bus_id"}
)


def fingerprint_hash(fp: Mapping[str, Any], exclude: frozenset[str] = VOLATILE_FINGERPRINT_KEYS) -> str:
    """sha256 over the canonical JSON (sorted keys) of the fingerprint, without machine/moment keys."""
    data = {k: v for k, v in (fp or {}).items() if k not in exclude}
    blob = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
