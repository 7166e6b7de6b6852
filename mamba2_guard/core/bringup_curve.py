"""The anytime curve of a bring-up measured with a GPU's own file withheld: ``baselines/bringup/<slug>.yaml``
in, the page ``docs/results/bringup-<slug>.md`` and its chart's data out.

Pure: the curve file as plain data (what ``yaml.safe_load`` gives) and each cited run's speedups in, values
and Markdown out. ``docs/results/build.py`` reads the files (the runs' speedups from the bench results in
``baselines/runs/bringup/``) and writes or checks the page.

The file holds one or more curves, each a bring-up from zero on one code (a new code may restart it), and a
yardstick: what the GPU gets from configs nobody withheld (its committed file, or one lent to it). A point of
a curve is the bring-up's device-minutes so far, what it had done, and the bench runs taken on that state; a
later run of a point overrides an earlier one at the same shape. A run benches some shapes only, so each point
says how many shapes it has, and compares with the yardstick over those shapes alone. A point may carry shapes
from an earlier point instead (``Carried``): those whose every launch selects the same config as then.

The bring-up's targets are judged per point, on the shapes each needs: the suite's three after the first
night, every zoo shape by 60 minutes, and the zoo's geometric mean within 5 % of the yardstick's by 120.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FIRST_NIGHT_MINUTES = 30.0  # the nightly's default tuning budget (autotune.total_budget_seconds)
EVERY_ZOO_SHAPE_MINUTES = 60.0
NEAR_YARDSTICK_MINUTES, NEAR_YARDSTICK_RATIO = 120.0, 0.95


@dataclass(frozen=True)
class Carried:
    """Shapes a point takes from an earlier point of its curve rather than benching them again: shapes whose
    every launch selects the config it selected at that point, as ``evidence`` shows (a ``dev selected
    --against`` report, in ``baselines/runs/bringup/``, of the point's config file against the earlier one's).
    The same configs run the same generated code, so such a shape's time differs only by the machine's noise."""

    from_minutes: float
    shapes: tuple[str, ...]
    evidence: str


@dataclass(frozen=True)
class Point:
    minutes: float
    after: str  # what the bring-up had done, in words
    runs: tuple[str, ...]  # bench result files, in the order they override each other
    note: str = ""
    carried: Carried | None = None


@dataclass(frozen=True)
class Curve:
    name: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class CurveFile:
    gpu: str
    curves: tuple[Curve, ...]
    yardstick: str  # what it is, in words
    yardstick_runs: tuple[str, ...]  # bench result files; empty: the GPU's committed baseline
    note: str = ""


def _fail(source: str, path: str, expected: str, got: Any) -> ValueError:
    return ValueError(f"{source}: {path}: expected {expected}, got {got!r}")


def _text(d: Mapping[str, Any], key: str, source: str, path: str, required: bool = True) -> str:
    value = d.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise _fail(source, f"{path}{key}", "a non-empty string", value)
    return value.strip()


def _files(value: Any, source: str, path: str, required: bool = True) -> tuple[str, ...]:
    if value is None and not required:
        return ()
    if (not isinstance(value, list) or (required and not value)
            or not all(isinstance(f, str) and f.endswith(".json") and "/" not in f for f in value)):
        raise _fail(source, path, "a list of bench result files (.json) in baselines/runs/bringup/", value)
    return tuple(value)


def _carried(raw: Any, earlier: Sequence[Point], source: str, path: str) -> Carried | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or set(raw) != {"from", "shapes", "evidence"}:
        raise _fail(source, path, "a mapping with from, shapes and evidence", raw)
    minutes = raw["from"]
    if isinstance(minutes, bool) or not any(minutes == p.minutes for p in earlier):
        raise _fail(source, f"{path}.from", "the minutes of an earlier point of the curve", minutes)
    shapes = raw["shapes"]
    if not isinstance(shapes, list) or not shapes or not all(isinstance(s, str) and s for s in shapes):
        raise _fail(source, f"{path}.shapes", "a non-empty list of shape names", shapes)
    evidence = raw["evidence"]
    if not isinstance(evidence, str) or not evidence.endswith(".json") or "/" in evidence:
        raise _fail(source, f"{path}.evidence", "a `dev selected --against` report (.json) in baselines/runs/bringup/",
                    evidence)
    return Carried(float(minutes), tuple(shapes), evidence)


def parse(doc: Any, source: str) -> CurveFile:
    """The curve file ``doc`` (``source``: its path, for errors); ValueError naming the field where it is
    malformed."""
    if not isinstance(doc, Mapping):
        raise _fail(source, "the file", "a mapping with gpu, curves and yardstick", type(doc).__name__)
    curves_raw = doc.get("curves")
    if not isinstance(curves_raw, list) or not curves_raw:
        raise _fail(source, "curves", "a non-empty list", curves_raw)
    curves = []
    for i, curve in enumerate(curves_raw):
        if not isinstance(curve, Mapping) or not isinstance(curve.get("points"), list) or not curve["points"]:
            raise _fail(source, f"curves[{i}]", "a mapping with a name and a non-empty list of points", curve)
        points = []
        for j, point in enumerate(curve["points"]):
            where = f"curves[{i}].points[{j}]."
            if not isinstance(point, Mapping):
                raise _fail(source, where[:-1], "a mapping", point)
            minutes = point.get("minutes")
            if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes >= 0:
                raise _fail(source, f"{where}minutes", "device-minutes, a number >= 0", minutes)
            if points and minutes < points[-1].minutes:
                raise _fail(source, f"{where}minutes", f"at least the point before's {points[-1].minutes}", minutes)
            points.append(Point(float(minutes), _text(point, "after", source, where),
                                _files(point.get("runs"), source, f"{where}runs"),
                                _text(point, "note", source, where, required=False),
                                _carried(point.get("carried"), points, source, f"{where}carried")))
        curves.append(Curve(_text(curve, "name", source, f"curves[{i}]."), tuple(points)))
    yardstick = doc.get("yardstick")
    if not isinstance(yardstick, Mapping):
        raise _fail(source, "yardstick", "a mapping with a name and runs (none: the GPU's baseline)", yardstick)
    return CurveFile(_text(doc, "gpu", source, ""), tuple(curves), _text(yardstick, "name", source, "yardstick."),
                     _files(yardstick.get("runs"), source, "yardstick.runs", required=False),
                     _text(doc, "note", source, "", required=False))


def merged_speedups(runs: Sequence[str], speedups_by_run: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """shape -> the whole call's speedup over ``runs`` (a point's, or the yardstick's): a later run's over an
    earlier's."""
    out: dict[str, float] = {}
    for run in runs:
        out.update(speedups_by_run.get(run, {}))
    return out


def unchanged_shapes(report: Any, where: str) -> set[str]:
    """The shapes of a ``dev selected --against`` report (``where`` names it in errors) at which every launch
    selects the config it selected from the file it was compared against."""
    shapes = report.get("shapes") if isinstance(report, Mapping) else None
    if not isinstance(shapes, Mapping) or not report.get("against"):
        raise ValueError(f"{where}: not a `dev selected --against` report (expected against and shapes)")

    def same(row: Any) -> bool:
        now, before = (row.get("now"), row.get("before")) if isinstance(row, Mapping) else (None, None)
        return isinstance(now, Mapping) and isinstance(before, Mapping) and now.get("config") == before.get("config")

    unchanged = set()
    for shape, entries in shapes.items():
        rows = [row for launches in (entries.values() if isinstance(entries, Mapping) else ())
                for row in (launches if isinstance(launches, list) else [None])]
        if rows and all(same(row) for row in rows):
            unchanged.add(shape)
    return unchanged


def with_carried(curve: Curve, speedups: Sequence[Mapping[str, float]], unchanged: Mapping[str, set[str]],
                 source: str, index: int) -> list[dict[str, float]]:
    """Each point's speedups (``merged_speedups``'s) with the shapes it carries (``Carried``) taken from the
    earlier point's; ``unchanged``: per evidence file, ``unchanged_shapes``. ValueError where a carried shape
    is one the point's own runs bench, one the earlier point lacks, or one its evidence does not show
    unchanged; ``index`` is the curve's, for the message."""
    out: list[dict[str, float]] = []
    for j, (point, own) in enumerate(zip(curve.points, speedups, strict=True)):
        merged = dict(own)
        if point.carried is not None:
            where = f"{source}: curves[{index}].points[{j}].carried.shapes"
            earlier = next(x for p, x in zip(curve.points[:j], out, strict=True)
                           if p.minutes == point.carried.from_minutes)
            for shape in point.carried.shapes:
                if shape in own:
                    raise ValueError(f"{where}: `{shape}` is benched by the point's own runs")
                if shape not in earlier:
                    raise ValueError(f"{where}: `{shape}` is not at the {point.carried.from_minutes:g}-minute point")
                if shape not in unchanged.get(point.carried.evidence, set()):
                    raise ValueError(f"{where}: `{shape}` does not select the same configs in "
                                     f"{point.carried.evidence}")
                merged[shape] = earlier[shape]
        out.append(merged)
    return out


def geomean(values: Sequence[float]) -> float | None:
    return statistics.geometric_mean(values) if values else None


def versus(point: Mapping[str, float], yardstick: Mapping[str, float], shapes: Sequence[str]
           ) -> tuple[list[str], float | None]:
    """The shapes of ``shapes`` that both the point and the yardstick have, and the geometric mean over them
    of the point's speedup over the yardstick's (None: no such shape)."""
    common = [s for s in shapes if s in point and s in yardstick]
    return common, geomean([point[s] / yardstick[s] for s in common])


@dataclass(frozen=True)
class Verdict:
    target: str
    met_at: float | None  # the device-minutes of the first point that meets it, within its minutes
    best: str  # the closest point within its minutes, in words: what it reached, or what it lacked
    # the first later point within its minutes that no longer meets it (a config of a later job can serve
    # another shape worse than the one before it did); None where none, or a point after it meets it again
    lost_at: float | None = None


def targets(curve: Curve, speedups: Sequence[Mapping[str, float]], yardstick: Mapping[str, float],
            suite_shapes: Sequence[str], zoo_shapes: Sequence[str]) -> list[Verdict]:
    """Issue 50's three targets on ``curve`` (``speedups``: each point's, as ``merged_speedups`` gives them).
    A point judges a target only where it has every shape the target needs; a target met is lost at a later
    point within its minutes that misses it, until one meets it again."""
    verdicts = []

    def first(minutes: float, judge) -> tuple[float | None, float | None, str]:
        met_at = lost_at = best = None
        best_text = met_text = "no point within the minutes has every shape it needs"
        for point, by_shape in zip(curve.points, speedups, strict=True):
            if point.minutes > minutes:
                break
            judged = judge(by_shape)
            if judged is None:
                continue
            ok, value, text = judged
            where = f"{text} at {point.minutes:g} minutes"
            if met_at is None:
                if ok:
                    met_at, met_text = point.minutes, where
                elif best is None or value > best:
                    best, best_text = value, where
            elif ok:
                if lost_at is not None:  # met again
                    lost_at, met_text = None, where
            elif lost_at is None:
                lost_at, met_text = point.minutes, where
        return met_at, lost_at, best_text if met_at is None else met_text

    def all_at_least_one(shapes: Sequence[str]):
        def judge(by_shape: Mapping[str, float]):
            if not shapes or any(s not in by_shape for s in shapes):
                return None
            low = min(shapes, key=lambda s: by_shape[s])
            return by_shape[low] >= 1.0, by_shape[low], f"lowest {by_shape[low]:.2f}x (`{low}`)"
        return judge

    def near_yardstick(by_shape: Mapping[str, float]):
        common, ratio = versus(by_shape, yardstick, zoo_shapes)
        if ratio is None or len(common) < len(zoo_shapes):
            return None
        return ratio >= NEAR_YARDSTICK_RATIO, ratio, f"{100 * ratio:.1f} % of the yardstick's geometric mean"

    for name, minutes, judge in [
            (f"the suite's shapes at >= 1.0x after the first night ({FIRST_NIGHT_MINUTES:g} minutes)",
             FIRST_NIGHT_MINUTES, all_at_least_one(suite_shapes)),
            (f"every zoo shape at >= 1.0x within {EVERY_ZOO_SHAPE_MINUTES:g} minutes", EVERY_ZOO_SHAPE_MINUTES,
             all_at_least_one(zoo_shapes)),
            (f"the zoo's geometric mean within {100 * (1 - NEAR_YARDSTICK_RATIO):g} % of the yardstick's within "
             f"{NEAR_YARDSTICK_MINUTES:g} minutes", NEAR_YARDSTICK_MINUTES, near_yardstick)]:
        met_at, lost_at, text = first(minutes, judge)
        verdicts.append(Verdict(name, met_at, text, lost_at))
    return verdicts


def chart_data(curves: CurveFile, speedups: Sequence[Sequence[Mapping[str, float]]], yardstick: Mapping[str, float],
               shapes: Sequence[str], zoo_shapes: Sequence[str]) -> dict[str, Any]:
    """What the chart draws (``adapters.charts.anytime_curves``): per curve, each shape's (minutes, speedup)
    where a point has it, each point's geometric mean over the shapes it has (minutes, mean, how many), and
    the yardstick's geometric mean over the zoo's shapes (the third target's)."""
    panels = []
    for curve, by_point in zip(curves.curves, speedups, strict=True):
        lines = {s: [[p.minutes, round(x[s], 4)] for p, x in zip(curve.points, by_point, strict=True) if s in x]
                 for s in shapes}
        means = []
        for point, by_shape in zip(curve.points, by_point, strict=True):
            present = [by_shape[s] for s in shapes if s in by_shape]
            if present:
                means.append([point.minutes, round(geomean(present), 4), len(present)])
        panels.append({"name": curve.name, "shapes": {s: pts for s, pts in lines.items() if pts}, "means": means})
    mean = geomean([yardstick[s] for s in zoo_shapes if s in yardstick])
    return {"panels": panels, "yardstick": curves.yardstick,
            "yardstick_geomean": None if mean is None else round(mean, 4)}


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def render(curves: CurveFile, speedups: Sequence[Sequence[Mapping[str, float]]], yardstick: Mapping[str, float],
           *, slug: str, source: str, suite_shapes: Sequence[str], zoo_shapes: Sequence[str],
           chart: str | None = None, versions: str = "") -> str:
    """The page (module docstring). ``speedups``: per curve, per point, shape -> speedup; ``yardstick``: shape ->
    speedup; ``versions``: the environment the runs name, in words."""
    shapes = [*dict.fromkeys([*suite_shapes, *zoo_shapes])]
    out = [f"# Bring-up from zero: {curves.gpu}", "",
           f"Generated by `python docs/results/build.py` from `{source}` and the bench runs it cites in "
           "`baselines/runs/bringup/`; do not edit by hand.", "",
           f"The guard's bring-up (`docs/guard.md`, **Bring-up**) run on this GPU with its own config file "
           f"withheld (`bring-up --withhold-configs`: slug `{slug}-withheld`, no other GPU's file lent or seeded), "
           "as if the GPU were new. Each point is the bring-up's device-minutes so far and benches of "
           "`mamba_chunk_scan_combined` forward + backward on that state: device time of CUDA-graph replays, ours "
           "against mamba-ssm in the same run, speedup = mamba-ssm's time over ours. The yardstick is "
           + curves.yardstick + "."
           + (f" {versions}" if versions else ""), ""]
    if curves.note:
        out += [curves.note, ""]
    if chart:
        out += [f"![Speedup against mamba-ssm per shape over the bring-up's device-minutes]({chart})", ""]
    for curve, by_point in zip(curves.curves, speedups, strict=True):
        out += [f"## {curve.name}", "", "| target | met at (device-minutes) | closest |", "|---|--:|---|"]
        for verdict in targets(curve, by_point, yardstick, suite_shapes, zoo_shapes):
            met = "not yet" if verdict.met_at is None else f"{verdict.met_at:g}" + (
                "" if verdict.lost_at is None else f", lost at {verdict.lost_at:g}")
            out.append(f"| {verdict.target} | {met} | {verdict.best} |")
        out += ["", "| shape | " + " | ".join(f"{p.minutes:g} min" for p in curve.points) + " | yardstick |",
                "|---|" + "--:|" * (len(curve.points) + 1)]
        for shape in shapes:
            cells = [_cell(x.get(shape)) + ("†" if p.carried and shape in p.carried.shapes else "")
                     for p, x in zip(curve.points, by_point, strict=True)]
            if any(cells):
                out.append(f"| `{shape}` | " + " | ".join(cells) + f" | {_cell(yardstick.get(shape))} |")
        counts, means, ratios = [], [], []
        for by_shape in by_point:
            present = [s for s in shapes if s in by_shape]
            common, ratio = versus(by_shape, yardstick, shapes)
            counts.append(f"{len(present)}/{len(shapes)}")
            means.append(_cell(geomean([by_shape[s] for s in present])))
            ratios.append("" if ratio is None else f"{ratio:.3f} ({len(common)})")
        out += [f"| shapes benched{' or carried (†)' if any(p.carried for p in curve.points) else ''} | "
                + " | ".join(counts) + " | "
                f"{sum(s in yardstick for s in shapes)}/{len(shapes)} |",
                "| geometric mean of those | " + " | ".join(means) + " | "
                f"{_cell(geomean([yardstick[s] for s in shapes if s in yardstick]))} |",
                "| over the yardstick, same shapes (shapes) | " + " | ".join(ratios) + " | 1 |", ""]
        for point in curve.points:
            runs = ", ".join(f"`{run}`" for run in point.runs)
            carried = "" if point.carried is None else (
                f" † Carried from the {point.carried.from_minutes:g}-minute point, not benched again: "
                + ", ".join(f"`{shape}`" for shape in point.carried.shapes) + ", whose every launch selects the "
                f"config it selected then (`{point.carried.evidence}`, `mamba2-guard dev selected --against`).")
            out.append(f"- **{point.minutes:g} min**, after {point.after}: {runs}."
                       + (f" {point.note}" if point.note else "") + carried)
        out.append("")
    return "\n".join(out)

