"""Charts drawn with matplotlib, written as SVG files that GitHub shows inline.

A chart file carries the digest of the data it was drawn from in its metadata (``digest``), so a check of a
committed chart compares its data, not its bytes: matplotlib's layout may change between its versions.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from mamba2_kernels.files import atomic_write

DIGEST = re.compile(r"<dc:description>data sha256 ([0-9a-f]{64})</dc:description>")
COLORS = {"held out": "#1f77b4", "tuned": "#bbbbbb"}


def digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def drawn_from(path: Path) -> str | None:
    """The digest of the data a chart file was drawn from, or None (no such file, or not one of ours)."""
    if not Path(path).is_file():
        return None
    match = DIGEST.search(Path(path).read_text(errors="replace"))
    return match.group(1) if match else None


def speedup_bars(series: Mapping[str, Sequence[tuple[str, str, float]]], title: str, path: Path) -> None:
    """One panel per call: a horizontal bar per shape, its speedup against mamba-ssm, coloured held out or
    tuned, with the line at 1.0x (mamba-ssm's speed). Written atomically as SVG."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = max(len(points) for points in series.values())
    fig = Figure(figsize=(4.2 * len(series), 0.28 * rows + 1.4), layout="constrained")
    axes = fig.subplots(1, len(series), squeeze=False)[0]
    for ax, (call, points) in zip(axes, series.items(), strict=True):
        labels = [shape for shape, _, _ in points][::-1]
        values = [value for _, _, value in points][::-1]
        ax.barh(labels, values, color=[COLORS[group] for _, group, _ in points][::-1])
        ax.axvline(1.0, color="black", linewidth=0.8)
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:.2f}x", va="center", fontsize=7)
        ax.set_title(call, fontsize=9)
        ax.set_xlim(0, max(values) * 1.18)
        ax.set_xlabel("speedup vs mamba-ssm (1.0 = same speed)", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.legend(handles=[Patch(color=c, label=g) for g, c in COLORS.items()], loc="outside lower center", ncol=2,
               fontsize=8)
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "mamba2-guard", "svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Description": f"data sha256 {digest(series)}"})
    atomic_write(Path(path), buffer.getvalue())
