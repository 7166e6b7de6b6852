"""A new GPU's bring-up as data: when one is due, the stages in the order of their value, the progress."""

from __future__ import annotations

import pytest

from mamba2_guard.core import bringup


def test_a_bring_up_is_due_for_a_missing_file_a_missing_kernel_or_an_unfinished_one():
    assert bringup.missing_kernels(None, ["scan", "dx"]) == ["dx", "scan"]
    assert bringup.missing_kernels({"scan": {"k=1": {}}, "dx": {}}, ["scan", "dx"]) == ["dx"]
    assert bringup.missing_kernels({"scan": {"k=1": {}}, "dx": {"k=1": {}}}, ["scan", "dx"]) == []
    stages = bringup.plan(whole_call="call", suite_kernels=["a"], suite_shapes=["s"], zoo_shapes=[],
                          grid_shapes=["s"], weight={}, other_files=False)
    started = bringup.new_state("gpu", stages, "t0")
    assert bringup.due(["dx"], None) and bringup.due([], started) and not bringup.due([], None)
    finished = started
    for stage in stages:
        finished = bringup.record(finished, stage.name, status=bringup.DONE, done=stage.jobs, seconds=1.0, now="t1")
    assert not bringup.due([], finished) and bringup.complete(finished)
    assert not bringup.due(["dx"], finished)  # a finished bring-up is not run again; the re-tune takes over
    # ... unless the kernel did not exist when it began: a kernel added since gets a bring-up of its own
    knew = {**finished, "kernels": ["scan"]}
    assert bringup.added_since(["dx", "scan"], knew) == ["dx"] and bringup.due(["dx"], knew)
    assert not bringup.due(["scan"], knew)  # known then, left without a config: the re-tune's


def test_the_whole_call_is_tuned_costliest_shape_first_and_borrowing_only_where_files_exist():
    weight = {"small": 1.0, "big": 9.0, "mid": 4.0, "grid-only": 2.0}
    stages = bringup.plan(whole_call="call", suite_kernels=["k1", "k2", "k1"], suite_shapes=["small", "mid"],
                          zoo_shapes=["big", "small"], grid_shapes=["mid", "grid-only", "unknown"], weight=weight,
                          other_files=True)
    by_name = {s.name: s for s in stages}
    assert [s.name for s in stages] == list(bringup.STAGES)
    assert by_name["borrow"].shapes == by_name["hot"].shapes == ("big", "mid", "small")
    assert by_name["borrow"].search == bringup.BORROWED and by_name["borrow"].missing_only
    assert by_name["hot"].search == bringup.SEARCH and not by_name["hot"].missing_only  # seeded, not skipped
    assert by_name["hot"].also_path == "chain"  # the state passes' other path, for a provisional chain rule
    assert by_name["suite"].kernels == ("k1", "k2") and by_name["suite"].missing_only
    assert by_name["grid"].shapes == ("grid-only", "unknown")  # the calls' shapes are reached already
    assert by_name["fit"].search == bringup.FITTED and by_name["fit"].shapes == ("mid", "grid-only", "unknown")
    # A kernel added to a tuned GPU: its calls are tuned, so the hot stage searches the fusions' path at the grid
    # the file was tuned and fitted on, only what has no config yet; the grid stage has nothing left.
    tuned = {s.name: s for s in bringup.plan(whole_call="call", suite_kernels=["k1"], suite_shapes=["small"],
                                             zoo_shapes=["big"], grid_shapes=["mid", "grid-only"], weight=weight,
                                             other_files=True, tuned_before=True)}
    assert tuned["hot"].shapes == ("mid", "grid-only") and tuned["hot"].missing_only
    assert tuned["hot"].also_path == "fused" and "fused path" in tuned["hot"].why
    assert tuned["grid"].jobs == 0 and tuned["borrow"].shapes == ("big", "small")
    assert tuned["suite"].jobs and tuned["suite"].missing_only
    alone = bringup.plan(whole_call="call", suite_kernels=["k1"], suite_shapes=["small"], zoo_shapes=[],
                         grid_shapes=[], weight=weight, other_files=False)
    assert alone[0].jobs == 0 and "no other GPU" in alone[0].why
    assert bringup.new_state("g", alone, "t")["stages"]["borrow"]["status"] == bringup.SKIPPED


def test_the_calls_go_in_the_order_of_their_reach_not_of_their_weight_alone():
    # Two kinds of shape: three costly ones of one kind ("a*", 0 apart but for their sizes) and two cheaper ones
    # of another ("b*"). By weight alone every "a" would come first and the "b"s would run on their configs.
    weight = {"a1": 10.0, "a2": 8.0, "a3": 6.0, "b1": 3.0, "b2": 2.0}
    kind = {"a1": ("a", 1), "a2": ("a", 2), "a3": ("a", 1), "b1": ("b", 1), "b2": ("b", 1)}

    def distance(x: str, y: str) -> float:
        (kx, sx), (ky, sy) = kind[x], kind[y]
        return (4.0 if kx != ky else 0.0) + (0.5 if sx != sy else 0.0)

    assert bringup.by_reach(list(weight), weight) == ["a1", "a2", "a3", "b1", "b2"]
    # b1 (3 x 4) before a2 (8 x 0.5); a3 is a1's twin and b2 b1's: they come last, the costlier first
    assert bringup.by_reach(list(weight), weight, distance) == ["a1", "b1", "a2", "a3", "b2"]
    stages = bringup.plan(whole_call="call", suite_kernels=["k"], suite_shapes=["a1", "b2"], zoo_shapes=list(weight),
                          grid_shapes=[], weight=weight, other_files=False, distance=distance)
    assert stages[1].shapes == ("a1", "b1", "a2", "a3", "b2")
    # unknown weights and ties keep the given order, duplicates once
    assert bringup.by_reach(["x", "y", "x", "z"], {}, distance=lambda a, b: 1.0) == ["x", "y", "z"]


def test_the_calls_measured_below_mamba_ssms_speed_come_first_the_slowest_first():
    speedups = {"a": 1.3, "b": 0.94, "c": 0.97, "d": 1.0, "gone": 0.5}
    assert bringup.below_par(["a", "b", "c", "d", "e", "b"], speedups) == ["b", "c"]
    assert bringup.below_par(["a", "d", "e"], speedups) == []  # at par, above it, or not measured


def test_the_time_left_is_estimated_per_stage_from_its_own_jobs_once_it_has_some():
    stages = bringup.plan(whole_call="call", suite_kernels=["k1", "k2", "k3"], suite_shapes=["a", "b"],
                          zoo_shapes=["c", "d"], grid_shapes=[], weight={}, other_files=False)
    state = bringup.new_state("gpu", stages, "t0")
    state = bringup.record(state, "hot", status=bringup.PARTIAL, done=2, seconds=600.0, now="t1")
    # no kernel job done yet: the suite's six at the whole calls' mean, as the bring-up's
    assert bringup.progress(state)["seconds_left"] == pytest.approx(2 * 300.0 + 6 * 300.0)
    state = bringup.record(state, "hot", status=bringup.DONE, done=4, seconds=1200.0, now="t2")
    state = bringup.record(state, "suite", status=bringup.PARTIAL, done=2, seconds=100.0, now="t3")
    summary = bringup.progress(state)
    assert summary["jobs_left"] == 4 and summary["seconds_left"] == pytest.approx(4 * 50.0)  # not 4 x 1300 / 6
    assert bringup.seconds_left({"hot": {"status": bringup.PENDING, "jobs": 3, "done": 0}}, None) is None


def test_progress_counts_jobs_estimates_the_time_left_and_the_speedup_so_far():
    stages = bringup.plan(whole_call="call", suite_kernels=["k1", "k2"], suite_shapes=["a", "b"], zoo_shapes=[],
                          grid_shapes=["a"], weight={}, other_files=False)
    state = bringup.new_state("gpu", stages, "t0")
    state = bringup.record(state, "hot", status=bringup.PARTIAL, done=1, seconds=60.0, now="t1")
    summary = bringup.progress(state, [1.2, 0.8, float("nan"), None])
    assert summary["stage"] == "hot"
    # grid: skipped, its shape is reached by the calls already
    assert (summary["jobs_done"], summary["jobs_left"], summary["jobs"]) == (1, 1 + 4 + 1, 7)
    assert summary["seconds_left"] == pytest.approx(60.0 * 6)
    assert summary["speedup_geomean"] == pytest.approx((1.2 * 0.8) ** 0.5, abs=1e-4)
    text = bringup.render(summary)
    assert "stage **hot**: 1 jobs done, 6 left" in text and "| hot | partial | 1/2 | 1.0 |" in text
    assert "0.98x mamba-ssm" in text
    # A stage's seconds are its total (a search stage's journal), not added night over night.
    state = bringup.record(state, "hot", status=bringup.DONE, done=2, seconds=90.0, now="t2")
    state = bringup.record(state, "suite", status=bringup.PARTIAL, done=1, seconds=15.0, now="t3")
    assert state["stages"]["hot"]["seconds"] == 90.0 and state["seconds"] == 105.0
    # A search stage's seconds are its runs' journals: a run after a change of kernel sources starts a new
    # journal, and the seconds of the earlier run still count (on the H200 they went missing).
    state = bringup.record(state, "suite", status=bringup.PARTIAL, done=1, seconds=40.0, now="t4", run="r1")
    state = bringup.record(state, "suite", status=bringup.PARTIAL, done=2, seconds=50.0, now="t5", run="r1")
    state = bringup.record(state, "suite", status=bringup.PARTIAL, done=1, seconds=30.0, now="t6", run="r2")
    assert state["stages"]["suite"]["seconds"] == 80.0 and state["stages"]["suite"]["run"] == "r2"
    # A state written before runs were kept apart holds its one run's seconds.
    state["stages"]["hot"].update(run="r0", seconds=360.4)
    state = bringup.record(state, "hot", status=bringup.DONE, done=2, seconds=486.1, now="t7", run="r3")
    assert state["stages"]["hot"]["seconds"] == 846.5 and state["seconds"] == 926.5
    assert bringup.current_stage(state) == "suite"
