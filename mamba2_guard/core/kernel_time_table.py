"""Where a whole call spends its device time, kernel by kernel, ours beside mamba-ssm's (pure).

``per_call`` folds a profiler's device events into one row per kernel name: milliseconds and launches per
call. ``table`` lines up two sides' rows by share of their call, so that a reader sees which of our kernels
costs more than mamba-ssm's counterpart (the names differ: ``_helion_chunk_scan_kernel`` against
``_chunk_scan_fwd_kernel``; the table does not pair them, it ranks each side).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelTime:
    name: str
    ms: float  # device milliseconds per call
    launches: int  # per call


def per_call(events: Iterable[tuple[str, float]], calls: int) -> list[KernelTime]:
    """``events``: (kernel name, device microseconds) of ``calls`` identical calls. Returns one row per name,
    slowest first (ties by name)."""
    if calls < 1:
        raise ValueError(f"calls: expected >= 1, got {calls}")
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for name, microseconds in events:
        total[name] += microseconds
        count[name] += 1
    rows = [KernelTime(name, total[name] / calls / 1000.0, count[name] // calls) for name in total]
    return sorted(rows, key=lambda row: (-row.ms, row.name))


def table(sides: Mapping[str, list[KernelTime]], top: int = 12, width: int = 60) -> str:
    """Each side's call total, then its ``top`` kernels with their share of that total."""
    lines = []
    for side, rows in sides.items():
        total = sum(row.ms for row in rows)
        lines.append(f"{side}: {total:.4f} ms per call, {sum(row.launches for row in rows)} launches")
        for row in rows[:top]:
            share = row.ms / total if total else 0.0
            lines.append(f"  {row.ms:9.4f} ms {share:6.1%} x{row.launches:<3d} {row.name[:width]}")
        if len(rows) > top:
            rest = sum(row.ms for row in rows[top:])
            lines.append(f"  {rest:9.4f} ms {rest / total if total else 0.0:6.1%}      {len(rows) - top} more kernels")
    return "\n".join(lines)
