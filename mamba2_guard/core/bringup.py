"""A new GPU's bring-up as data: whether one is due, its stages in the order of their value, and its progress.

Pure: names, numbers and plain dicts in, plain values out. ``mamba2_guard.flows.bringup`` runs the stages
(each an autotune run, resumable from its own journal) and keeps the state dict this module reads.

A GPU model whose config file is missing, or holds no config of a kernel the suites run, gets the stages
below, each started only once those before it are done or skipped:

``borrow``  every other GPU's stored configs (other architectures included), adapted to each launch and
            tried on this GPU: a config that generates code, passes precision and beats Helion's default
            is stored as this GPU's own; one that fails here is never stored (the default is).
``hot``     Helion's search, seeded from what ``borrow`` stored, on the whole SSD call at the suite's and the
            zoo's shapes in the order of their reach (``by_reach``): the call of most device time first, then
            each time the call whose time the calls before it serve least, so that the first nights fix
            most of the time at every kind of shape, not only at the costliest kind. A call the night's
            bench measured below mamba-ssm's goes first (``below_par``), the slowest first.
            Each job also searches the launches of the state passes' other path, the chain, then times the two
            paths against each other at its shape: a provisional chain rule is fitted on the shapes searched
            so far, because the path decides as much of a call's time as its configs do, and the fit stage's
            rule comes only after every stage before it.
            On a GPU whose file held configs when the bring-up began (a kernel added since), its calls are
            tuned: the stage searches the fusions' path instead (``also_path`` fused), at the selection grid's
            shapes, which that file was tuned and fitted on, only the launches still without a config (the
            fused kernels'), and fits a provisional fuse rule on the two paths' timings the same way.
``suite``   every kernel of the suite at the suite's shapes, searching only the launches still without a config.
``grid``    the whole call at the selection grid's shapes not reached yet.
``fit``     ``measure-selection`` over the grid, then the selection rule's fit, into the same file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BORROW, HOT, SUITE, GRID, FIT = "borrow", "hot", "suite", "grid", "fit"
STAGES = (BORROW, HOT, SUITE, GRID, FIT)
# How a stage finds its configs: trying other GPUs' stored configs, Helion's search, or the selection fit.
BORROWED, SEARCH, FITTED = "borrowed", "helion", "fit"
# A stage's state: not started or cut short by the budget (resumed by the next run), or finished.
PENDING, PARTIAL, DONE, SKIPPED = "pending", "partial", "done", "skipped"
FINISHED = (DONE, SKIPPED)


@dataclass(frozen=True)
class Stage:
    name: str
    kernels: tuple[str, ...]  # registry entries
    shapes: tuple[str, ...]  # suite shapes, in the order of their value
    search: str  # BORROWED | SEARCH | FITTED
    missing_only: bool  # search only launches whose key has no config of its own yet
    why: str
    # The path ("chain" or "fused") whose launches its whole-call jobs also search, in every fused stage whose
    # rule-less default is the other, timing the two paths for a provisional rule (None: the rules' paths only).
    also_path: str | None = None

    @property
    def jobs(self) -> int:
        return len(self.kernels) * len(self.shapes)


def missing_kernels(own: Mapping[str, Mapping[str, Any]] | None, needed: Iterable[str]) -> list[str]:
    """The Helion kernels of ``needed`` that a GPU's file (its ``kernels`` section, None: no file) holds no
    config of, sorted."""
    own = own or {}
    return sorted(name for name in set(needed) if not own.get(name))


def due(missing: Sequence[str], state: Mapping[str, Any] | None) -> bool:
    """A bring-up is due while one that started has stages left, or, before any started, while the file lacks
    kernels; and again once one is complete, for kernels added since it began (``added_since``). Kernels a
    complete one left without a config (a search that failed) go to the warm re-tune and the seen-keys tuning
    like any other GPU's, not to another bring-up."""
    if state:
        return not complete(state) or bool(added_since(missing, state))
    return bool(missing)


def added_since(missing: Sequence[str], state: Mapping[str, Any]) -> list[str]:
    """The kernels of ``missing`` that did not exist when ``state``'s bring-up began (none for a state that did
    not record them), sorted."""
    known = state.get("kernels")
    return [] if known is None else sorted(set(missing) - set(known))


def by_reach(shapes: Sequence[str], weight: Mapping[str, float],
             distance: Callable[[str, str], float] | None = None) -> list[str]:
    """``shapes`` (duplicates dropped) in the order a search of each serves the most time: the costliest
    first, then each time the one of most ``weight`` x ``distance`` to the nearest shape before it.

    A config tuned at one shape serves every other shape whose launches have no config of their own, as the
    nearest or a related key (``mamba2_kernels.config_store``), and serves it the worse the farther its key
    is: ``distance(a, b)`` is the config store's distance between the keys of the two shapes' calls (0: the
    same code). Ordered by weight alone, the calls of one kind of shape, the costliest, would all come first,
    and every other kind would run on their configs for as many nights. Shapes no farther than 0 from one
    before them come last, the costliest first. Without ``distance`` every two shapes are equally far: the
    costliest first all along. Equal or unknown weights keep the given order."""
    left = list(dict.fromkeys(shapes))
    nearest = dict.fromkeys(left, 1.0)  # each shape's distance to the nearest one ordered (none yet: all alike)
    order: list[str] = []

    def reach(shape: str) -> tuple[float, float, int]:
        own = weight.get(shape, 0.0)
        return own * nearest[shape], own, -left.index(shape)

    while left:
        best = max(left, key=reach)
        order.append(best)
        left.remove(best)
        if distance is not None:
            for shape in left:
                d = distance(shape, best)
                nearest[shape] = d if len(order) == 1 else min(nearest[shape], d)
    return order


PAR = 1.0  # the product's promise: the whole call at least as fast as mamba-ssm's at every shape


def below_par(shapes: Sequence[str], speedups: Mapping[str, float]) -> list[str]:
    """The shapes of ``shapes`` whose whole call was last measured below ``PAR`` against mamba-ssm
    (``speedups``: mamba-ssm's time over ours, per shape), slowest first: a stage's search starts with them.

    The order of reach is a plan made before anything was measured: a call served by the configs of a
    nearer key can measure slower than mamba-ssm's for nights while its own job waits its turn. A night's
    bench says which calls those are, and the promise they break is the one users see."""
    measured = [shape for shape in dict.fromkeys(shapes) if speedups.get(shape, PAR) < PAR]
    return sorted(measured, key=lambda shape: speedups[shape])


def plan(*, whole_call: str, suite_kernels: Sequence[str], suite_shapes: Sequence[str], zoo_shapes: Sequence[str],
         grid_shapes: Sequence[str], weight: Mapping[str, float], other_files: bool,
         distance: Callable[[str, str], float] | None = None, tuned_before: bool = False) -> list[Stage]:
    """The stages of a bring-up (module docstring). ``weight``: estimated device ms of the whole call per shape;
    ``other_files``: whether any other GPU's config file exists to borrow from; ``distance``: how far apart two
    shapes' calls are in the config store's terms (``by_reach``); ``tuned_before``: whether this
    GPU's own file held configs when the bring-up began."""
    calls = tuple(by_reach([*suite_shapes, *zoo_shapes], weight, distance))
    hot = tuple(by_reach(grid_shapes, weight, distance)) if tuned_before else calls
    grid = tuple(by_reach([s for s in grid_shapes if s not in hot], weight, distance))
    return [
        Stage(BORROW, (whole_call,), calls if other_files else (), BORROWED, True,
              "other GPUs' configs, validated here" if other_files else "no other GPU's config file"),
        Stage(HOT, (whole_call,), hot, SEARCH, tuned_before,
              "the file held configs when the bring-up began: the whole call's fused path at the selection grid's "
              "shapes, where it has no config yet" if tuned_before
              else "the whole call at the suite and zoo shapes, in the order of their reach",
              "fused" if tuned_before else "chain"),
        Stage(SUITE, tuple(dict.fromkeys(suite_kernels)), tuple(suite_shapes), SEARCH, True,
              "every suite kernel's launches still without a config"),
        Stage(GRID, (whole_call,), grid, SEARCH, True, "the selection grid's shapes not reached yet"),
        Stage(FIT, (whole_call,), tuple(dict.fromkeys(grid_shapes)), FITTED, False,
              "measure-selection over the grid, then the selection rule's fit"),
    ]


def stage_state(stage: Stage) -> dict[str, Any]:
    """A stage not started: pending, or skipped when it has no jobs."""
    return {"status": PENDING if stage.jobs else SKIPPED, "jobs": stage.jobs, "done": 0, "seconds": 0.0,
            "why": stage.why}


def new_state(gpu_slug: str, stages: Sequence[Stage], now: str, tuned_before: bool = False,
              kernels: Iterable[str] | None = None) -> dict[str, Any]:
    """A bring-up not started; ``kernels``: every kernel that exists as it begins (None: not recorded, so none
    counts as added since)."""
    known = {} if kernels is None else {"kernels": sorted(kernels)}
    return {"gpu_slug": gpu_slug, "started": now, "updated": now, "seconds": 0.0, "tuned_before": tuned_before,
            **known, "stages": {s.name: stage_state(s) for s in stages}}


def record(state: Mapping[str, Any], stage: str, *, status: str, done: int, seconds: float, now: str,
           run: str | None = None, **extra: Any) -> dict[str, Any]:
    """``state`` with ``stage`` at ``status``, ``done`` jobs finished and ``seconds`` spent on it: in all, or,
    for a search stage, in its autotune ``run`` (the run's journal: every attempt's, those of a night that was
    killed too, so a kill loses only the job in flight). A stage whose run changed (new kernel sources or
    versions start a new run) keeps the seconds of its earlier runs. The whole bring-up's seconds are its
    stages'."""
    old = state["stages"][stage]
    by_run = dict(old.get("seconds_by_run") or ({old["run"]: old.get("seconds") or 0.0} if old.get("run") else {}))
    if run is not None:
        by_run[run] = round(float(seconds), 1)
        extra.update(run=run, seconds_by_run=by_run)
    stage_seconds = sum(by_run.values()) if run is not None else float(seconds)
    stages = {**state["stages"], stage: {**old, **extra, "status": status, "done": done,
                                         "seconds": round(stage_seconds, 1)}}
    total = sum(float(s.get("seconds") or 0) for s in stages.values())
    return {**state, "stages": stages, "updated": now, "seconds": round(total, 1)}


def complete(state: Mapping[str, Any]) -> bool:
    return all(s.get("status") in FINISHED for s in state.get("stages", {}).values())


def current_stage(state: Mapping[str, Any]) -> str | None:
    """The first stage not finished (None: the bring-up is complete)."""
    return next((name for name in STAGES if state.get("stages", {}).get(name, {}).get("status") not in FINISHED
                 and name in state.get("stages", {})), None)


def progress(state: Mapping[str, Any], speedups: Sequence[float] = ()) -> dict[str, Any]:
    """What the report, the PR body and the metrics show: the stage, the jobs done and left, the seconds
    spent, an estimate of the seconds left (``seconds_left``), and the geometric mean of the whole calls'
    speedups against mamba-ssm so far (``speedups``: the latest bench's)."""
    stages = state.get("stages", {})
    done = sum(int(s.get("done") or 0) for s in stages.values())
    jobs = sum(int(s.get("jobs") or 0) for s in stages.values() if s.get("status") != SKIPPED)
    left = sum(_jobs_left(s) for s in stages.values())
    seconds = float(state.get("seconds") or 0)
    finite = [float(x) for x in speedups if isinstance(x, (int, float)) and math.isfinite(x) and x > 0]
    return {"stage": current_stage(state) or "complete", "jobs_done": done, "jobs_left": left, "jobs": jobs,
            "seconds": round(seconds, 1), "seconds_left": seconds_left(stages, seconds / done if done else None),
            "speedup_geomean": round(math.exp(sum(map(math.log, finite)) / len(finite)), 4) if finite else None,
            "stages": {name: dict(stages[name]) for name in STAGES if name in stages}}


def _jobs_left(stage: Mapping[str, Any]) -> int:
    if stage.get("status") in FINISHED:
        return 0
    return max(0, int(stage.get("jobs") or 0) - int(stage.get("done") or 0))


def seconds_left(stages: Mapping[str, Mapping[str, Any]], mean_job_seconds: float | None) -> float | None:
    """The seconds the stages' jobs left can be expected to take: each stage's at the mean seconds of its own
    jobs done, a stage with none done at ``mean_job_seconds`` (the whole bring-up's); None while a stage with
    jobs left has neither. A whole call's job checks a dozen launches and a kernel's job one or two: at the
    bring-up's mean, which the whole calls' jobs set, a started `suite` stage's hundred kernel jobs were
    estimated at several times their time."""
    total = 0.0
    for stage in stages.values():
        count = _jobs_left(stage)
        if not count:
            continue
        done = int(stage.get("done") or 0)
        mean = float(stage.get("seconds") or 0) / done if done else mean_job_seconds
        if mean is None:
            return None
        total += count * mean
    return round(total, 1)


def render(summary: Mapping[str, Any]) -> str:
    """The progress as Markdown lines (the report's and the PR body's section)."""
    left = summary.get("seconds_left")
    speed = summary.get("speedup_geomean")
    lines = [f"Bring-up stage **{summary['stage']}**: {summary['jobs_done']} jobs done, {summary['jobs_left']} left, "
             f"{summary['seconds'] / 60:.1f} device-minutes spent"
             + (f", about {left / 60:.0f} more" if isinstance(left, (int, float)) and left else "")
             + (f"; whole calls {speed:.2f}x mamba-ssm (geometric mean)" if speed else "") + ".", "",
             "| stage | status | jobs done | minutes | what |", "|---|---|---|---|---|"]
    for name, s in summary.get("stages", {}).items():
        lines.append(f"| {name} | {s.get('status')} | {s.get('done', 0)}/{s.get('jobs', 0)} | "
                     f"{float(s.get('seconds') or 0) / 60:.1f} | {s.get('why', '')} |")
    return "\n".join(lines)
