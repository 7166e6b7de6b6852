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
from typing import Any

from mamba2_kernels.files import atomic_write

DIGEST = re.compile(r"<dc:description>data sha256 ([0-9a-f]{64})</dc:description>")
COLORS = {"held out": "#1f77b4", "steered": "#ff7f0e", "tuned": "#bbbbbb"}


def digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def drawn_from(path: Path) -> str | None:
    """The digest of the data a chart file was drawn from, or None (no such file, or not one of ours)."""
    if not Path(path).is_file():
        return None
    match = DIGEST.search(Path(path).read_text(errors="replace"))
    return match.group(1) if match else None


def speedup_bars(series: Mapping[str, Sequence[tuple[str, str, float]]], title: str, path: Path) -> None:
    """One panel per call: a horizontal bar per shape, its speedup against mamba-ssm, coloured by its class
    (held out, steered or tuned), with the line at 1.0x (mamba-ssm's speed). Written atomically as SVG."""
    _, Figure = _matplotlib()
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
    present = {group for points in series.values() for _, group, _ in points}
    fig.legend(handles=[Patch(color=c, label=g) for g, c in COLORS.items() if g in present],
               loc="outside lower center", ncol=len(present), fontsize=8)
    _save_svg(fig, series, path)


def anytime_curves(data: Mapping[str, Any], title: str, path: Path) -> None:
    """One panel per curve of a bring-up (``mamba2_guard.core.bringup_curve.chart_data`` gives ``data``) over
    the device-minutes spent: each shape's speedup against mamba-ssm as a grey line through the points that
    benched it, and in bold the geometric mean over the shapes each point benched (their number beside it);
    the black line at 1.0x (mamba-ssm's speed), the dashed one at the yardstick's geometric mean over the zoo,
    the dotted one at 95 % of it (the third target). Written atomically as SVG."""
    _, Figure = _matplotlib()

    panels = data["panels"]
    fig = Figure(figsize=(5.2 * len(panels), 3.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    yardstick = data.get("yardstick_geomean")
    for ax, panel in zip(axes, panels, strict=True):
        ax.axhline(1.0, color="black", linewidth=0.8, label="mamba-ssm")
        if yardstick:
            ax.axhline(yardstick, color="#2ca02c", linestyle="--", linewidth=1, label=f"yardstick {yardstick:.2f}x")
            ax.axhline(0.95 * yardstick, color="#2ca02c", linestyle=":", linewidth=1, label="95 % of it")
        for points in panel["shapes"].values():
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=".", color="#bbbbbb", linewidth=0.7, markersize=4)
        if panel["means"]:
            ax.plot([m[0] for m in panel["means"]], [m[1] for m in panel["means"]], marker="o", color="#1f77b4",
                    linewidth=2, markersize=5, label="geometric mean of the shapes a point has")
            for x, y, count in panel["means"]:
                ax.annotate(f" {count}", (x, y), fontsize=7, color="#1f77b4")
        ax.set_xlim(left=0)
        ax.set_title(panel["name"], fontsize=8)
        ax.set_xlabel("device-minutes of bring-up", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("speedup vs mamba-ssm (grey: each shape)", fontsize=8)
    axes[0].legend(fontsize=6, loc="lower right")
    fig.suptitle(title, fontsize=10)
    _save_svg(fig, data, path)


def speedup_trends(series: Mapping[str, Sequence[Mapping[str, Any]]], band: float, title: str, path: Path) -> None:
    """Small multiples, one panel per kernel: each shape's speedup against mamba-ssm as a ratio to its
    baseline's, over the history window with this run last (x = 0); the grey band is ``band`` (the regression
    threshold) around the baseline, and a red cross marks a case this run judged a regression
    (``mamba2_guard.core.report.speedup_trends`` gives ``series``). Written atomically as SVG."""
    _, Figure = _matplotlib()
    kernels = sorted(series)
    columns = min(4, len(kernels))
    rows = -(-len(kernels) // columns)
    fig = Figure(figsize=(3.3 * columns, 2.3 * rows + 0.9), layout="constrained")
    axes = list(fig.subplots(rows, columns, squeeze=False).flat)
    for ax, kernel in zip(axes, kernels, strict=False):
        ax.axhspan(1 - band, 1 + band, color="#e4e4e4", linewidth=0)
        ax.axhline(1.0, color="black", linewidth=0.6)
        for case in series[kernel]:
            points = case["points"]
            xs = range(1 - len(points), 1)
            ax.plot(xs, points, marker=".", linewidth=1, markersize=4, label=case["shape"])
            if case["regression"]:
                ax.plot(0, points[-1], "x", color="red", markersize=8, markeredgewidth=2)
        ax.set_title(kernel, fontsize=8)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=5, loc="best")
    for ax in axes[len(kernels):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.supxlabel("runs before this one (0: this run)", fontsize=8)
    fig.supylabel("speedup vs mamba-ssm / the baseline's", fontsize=8)
    _save_svg(fig, {"band": band, "series": series}, path)


def _matplotlib():
    """matplotlib without a display, and its Figure (no pyplot: no global state between charts)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return matplotlib, Figure


def _save_svg(fig: Any, data: object, path: Path) -> None:
    """``fig`` as SVG at ``path``, atomically, with the digest of ``data`` and no date in its metadata: the same
    data gives the same file, and ``drawn_from`` can check it."""
    import io

    matplotlib, _ = _matplotlib()
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "mamba2-guard", "svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Description": f"data sha256 {digest(data)}"})
    atomic_write(Path(path), buffer.getvalue())
