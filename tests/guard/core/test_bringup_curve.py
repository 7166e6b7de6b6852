"""mamba2_guard.core.bringup_curve (the anytime curve's page, pure) and its part of docs/results/build.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mamba2_guard.core import bringup_curve
from tests.guard.core.test_results_page import _build, _tree

SUITE, ZOO = ["s1"], ["z1", "z2"]


def curve_file(points: list[dict]) -> bringup_curve.CurveFile:
    doc = {"gpu": "Test GPU", "curves": [{"name": "from zero", "points": points}],
           "yardstick": {"name": "the committed file"}}
    return bringup_curve.parse(doc, "curve.yaml")


def point(minutes: float, *runs: str) -> dict:
    return {"minutes": minutes, "after": f"{minutes} minutes", "runs": list(runs)}


def test_a_later_run_of_a_point_overrides_an_earlier_one_and_the_yardstick_compares_common_shapes():
    got = bringup_curve.merged_speedups(["a.json", "b.json"], {"a.json": {"z1": 0.9, "z2": 1.2}, "b.json": {"z1": 1.1}})
    assert got == {"z1": 1.1, "z2": 1.2}
    common, ratio = bringup_curve.versus(got, {"z1": 1.1, "s1": 2.0}, [*SUITE, *ZOO])
    assert common == ["z1"] and ratio == pytest.approx(1.0)


def test_each_target_is_met_at_the_first_point_within_its_minutes_that_has_every_shape_it_needs():
    curves = curve_file([point(10, "a.json"), point(20, "b.json"), point(50, "c.json"), point(130, "d.json")])
    speedups = [{"s1": 1.1, "z1": 0.9},  # the suite's shape passes; the zoo's misses z2: not judged
                {"s1": 1.2, "z1": 0.95, "z2": 1.3},  # every zoo shape, one below 1.0x
                {"s1": 1.3, "z1": 1.05, "z2": 1.3},  # every zoo shape at 1.0x; 0.90 of the yardstick
                {"s1": 1.3, "z1": 1.2, "z2": 1.4}]  # within 5 %, but past 120 minutes
    yardstick = {"z1": 1.2, "z2": 1.4}
    first_night, every_zoo_shape, near = bringup_curve.targets(curves.curves[0], speedups, yardstick, SUITE, ZOO)
    assert first_night.met_at == 10 and "lowest 1.10x (`s1`)" in first_night.best
    assert every_zoo_shape.met_at == 50 and "lowest 1.05x (`z1`)" in every_zoo_shape.best
    assert near.met_at is None and near.best == "90.1 % of the yardstick's geometric mean at 50 minutes"


def test_a_target_met_and_then_missed_within_its_minutes_is_lost_until_a_point_meets_it_again():
    """A later job's configs can serve another shape worse than those before them: the page must not keep
    saying the target is met once a later point within its minutes misses it."""
    curves = curve_file([point(20, "a.json"), point(40, "b.json"), point(55, "c.json"), point(70, "d.json")])
    speedups = [{"s1": 1.2, "z1": 1.05, "z2": 1.3},  # met
                {"s1": 1.2, "z1": 0.94, "z2": 1.3},  # lost
                {"s1": 1.2, "z1": 0.97, "z2": 1.3},  # still lost: the first loss is the one named
                {"s1": 1.2, "z1": 0.5, "z2": 1.3}]  # past 60 minutes: not judged for the zoo's target
    every_zoo_shape = bringup_curve.targets(curves.curves[0], speedups, {}, SUITE, ZOO)[1]
    assert (every_zoo_shape.met_at, every_zoo_shape.lost_at) == (20, 40)
    assert every_zoo_shape.best == "lowest 0.94x (`z1`) at 40 minutes"
    speedups[2]["z1"] = 1.01
    every_zoo_shape = bringup_curve.targets(curves.curves[0], speedups, {}, SUITE, ZOO)[1]
    assert (every_zoo_shape.met_at, every_zoo_shape.lost_at) == (20, None)
    assert every_zoo_shape.best == "lowest 1.01x (`z1`) at 55 minutes"


def test_a_target_no_point_can_judge_says_so():
    curves = curve_file([point(10, "a.json")])
    verdicts = bringup_curve.targets(curves.curves[0], [{"z1": 1.5}], {"z1": 1.0, "z2": 1.0}, SUITE, ZOO)
    assert [v.met_at for v in verdicts] == [None, None, None]
    assert {v.best for v in verdicts} == {"no point within the minutes has every shape it needs"}


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["curves"][0]["points"][1].update(minutes=5), "curves[0].points[1].minutes: expected at least"),
    (lambda d: d["curves"][0]["points"][0].update(minutes=-1), "curves[0].points[0].minutes: expected device-minutes"),
    (lambda d: d["curves"][0]["points"][0].update(runs=["../a.json"]), "curves[0].points[0].runs: expected a list"),
    (lambda d: d["curves"][0]["points"][0].update(runs=[]), "curves[0].points[0].runs: expected a list"),
    (lambda d: d["curves"][0]["points"][0].pop("after"), "curves[0].points[0].after: expected a non-empty"),
    (lambda d: d.pop("yardstick"), "yardstick: expected a mapping"),
    (lambda d: d.update(curves=[]), "curves: expected a non-empty list"),
])
def test_a_malformed_curve_file_is_an_error_naming_the_file_and_the_field(change, message):
    doc = {"gpu": "g", "curves": [{"name": "c", "points": [point(10, "a.json"), point(20, "b.json")]}],
           "yardstick": {"name": "y"}}
    change(doc)
    with pytest.raises(ValueError, match=r"^curve\.yaml: " + message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(".", r"\.")):
        bringup_curve.parse(doc, "curve.yaml")


def selected_report(changed: dict[str, bool]) -> dict:
    """A ``dev selected --against`` report: per shape, one launch whose config changed or not."""
    def row(moved: bool) -> dict:
        return {"now": {"kernel": "k", "config": {"w": 2 if moved else 1}},
                "before": {"kernel": "k", "config": {"w": 1}}}

    return {"gpu_slug": "g", "against": "/tmp/old.yaml",
            "shapes": {shape: {"ssd_combined_fwd_bwd": [row(False), row(moved)]} for shape, moved in changed.items()}}


def carrying(shapes: list[str], frm: float = 10) -> dict:
    return {**point(20, "b.json"), "carried": {"from": frm, "shapes": shapes, "evidence": "sel.json"}}


def test_a_point_carries_the_shapes_whose_launches_select_as_at_an_earlier_point():
    unchanged = bringup_curve.unchanged_shapes(selected_report({"z1": False, "z2": True}), "sel.json")
    assert unchanged == {"z1"}
    torn = selected_report({"z1": False, "z3": False})
    torn["shapes"]["z3"]["ssd_combined_fwd_bwd"][0] = {"now": "?"}  # a malformed row moves nothing into the set
    assert bringup_curve.unchanged_shapes(torn, "sel.json") == {"z1"}
    curves = curve_file([point(10, "a.json"), carrying(["z1"])])
    own = [{"s1": 1.0, "z1": 0.9, "z2": 1.1}, {"s1": 1.1, "z2": 1.3}]
    assert bringup_curve.with_carried(curves.curves[0], own, {"sel.json": unchanged}, "curve.yaml", 0) == [
        {"s1": 1.0, "z1": 0.9, "z2": 1.1}, {"s1": 1.1, "z2": 1.3, "z1": 0.9}]
    # the second point judges the zoo's target with z1 carried: every zoo shape is there
    every_zoo_shape = bringup_curve.targets(curves.curves[0], [own[0], {**own[1], "z1": 0.9}], {}, SUITE, ZOO)[1]
    assert every_zoo_shape.best == "lowest 0.90x (`z1`) at 10 minutes"
    page = bringup_curve.render(curves, [[own[0], {**own[1], "z1": 0.9}]], {}, slug="g", source="curve.yaml",
                                suite_shapes=SUITE, zoo_shapes=ZOO)
    assert "| `z1` | 0.90x | 0.90x† |  |" in page
    assert ("† Carried from the 10-minute point, not benched again: `z1`, whose every launch selects the config "
            "it selected then (`sel.json`, `mamba2-guard dev selected --against`).") in page


@pytest.mark.parametrize(("carried", "own", "message"), [
    (["z2"], {"s1": 1.1}, "`z2` does not select the same configs in sel.json"),
    (["z1"], {"z1": 1.0}, "`z1` is benched by the point's own runs"),
    (["z3"], {}, "`z3` is not at the 10-minute point"),
])
def test_a_carried_shape_must_be_unbenched_at_the_earlier_point_and_unchanged(carried, own, message):
    unchanged = bringup_curve.unchanged_shapes(selected_report({"z1": False, "z2": True, "z3": False}), "sel.json")
    curves = curve_file([point(10, "a.json"), carrying(carried)])
    with pytest.raises(ValueError) as raised:
        bringup_curve.with_carried(curves.curves[0], [{"z1": 0.9, "z2": 1.0}, own], {"sel.json": unchanged},
                                   "curve.yaml", 0)
    assert str(raised.value) == f"curve.yaml: curves[0].points[1].carried.shapes: {message}"


@pytest.mark.parametrize(("carried", "message"), [
    ({"from": 15, "shapes": ["z1"], "evidence": "sel.json"}, "carried.from: expected the minutes of an earlier"),
    ({"from": 10, "shapes": [], "evidence": "sel.json"}, "carried.shapes: expected a non-empty list"),
    ({"from": 10, "shapes": ["z1"], "evidence": "../sel.json"}, "carried.evidence: expected a `dev selected"),
    ({"from": 10, "shapes": ["z1"]}, "carried: expected a mapping with from, shapes and evidence"),
])
def test_a_malformed_carry_is_an_error_naming_the_field(carried, message):
    with pytest.raises(ValueError, match=r"^curve\.yaml: curves\[0\]\.points\[1\]\." + message.replace(".", r"\.")):
        curve_file([point(10, "a.json"), {**point(20, "b.json"), "carried": carried}])
    with pytest.raises(ValueError, match=r"^sel.json: not a `dev selected --against` report"):
        bringup_curve.unchanged_shapes({"shapes": {}}, "sel.json")


def bench_result(path: Path, speedups: dict[str, float], uuid: str = "GPU-0000aaaa-11") -> str:
    """A bench result at ``path`` with the whole call at each shape of ``speedups`` (ours 1 ms)."""
    cases = [{"kernel": "ssd_combined_fwd_bwd", "shape": shape, "phase": "call_fwd_bwd",
              "samples_ms": {"helion": [1.0, 1.0, 1.0], "mamba_ssm": [x, x, x]}} for shape, x in speedups.items()]
    path.write_text(json.dumps({"schema_version": 1, "started_at": "2026-03-03T00:00:00+00:00", "cases": cases,
                                "fingerprint": {"gpu_name": "Test GPU", "gpu_uuid": uuid, "helion": "9.9"}}))
    return path.name


def test_build_renders_the_curve_from_the_runs_it_cites_and_check_catches_a_stale_page(tmp_path):
    root = _tree(tmp_path)
    runs = root / "baselines" / "runs" / "bringup"
    runs.mkdir(parents=True)
    early = bench_result(runs / "gpu-withheld-a.json", {"s1": 0.8, "grid1": 0.5})
    late = bench_result(runs / "gpu-withheld-b.json", {"s1": 1.25, "grid1": 1.5})
    lent = bench_result(runs / "gpu-lent.json", {"grid1": 1.6})
    (root / "baselines" / "bringup").mkdir()
    curve = root / "baselines" / "bringup" / "test-gpu.yaml"
    curve.write_text(yaml.safe_dump({"gpu": "Test GPU", "curves": [
        {"name": "from zero", "points": [point(0, early), point(12.5, late)]}],
        "yardstick": {"name": "the lent file", "runs": [lent]}}))
    assert _build(root).returncode == 0
    page = (root / "docs" / "results" / "bringup-test-gpu.md").read_text()
    assert "| `s1` | 0.80x | 1.25x |  |" in page and "| `grid1` | 0.50x | 1.50x | 1.60x |" in page
    assert "| the suite's shapes at >= 1.0x after the first night (30 minutes) | 12.5 |" in page
    assert "| over the yardstick, same shapes (shapes) | 0.312 (1) | 0.938 (1) | 1 |" in page
    assert "helion 9.9, on the cards GPU-0000aaaa" in page
    assert (root / "docs" / "results" / "bringup-test-gpu.svg").is_file()
    assert _build(root, "--check").returncode == 0
    bench_result(runs / late, {"s1": 1.25, "grid1": 1.55})  # a run re-recorded: the page and chart go stale
    stale = _build(root, "--check")
    assert stale.returncode == 1
    assert "docs/results/bringup-test-gpu.md is stale" in stale.stderr
    assert "docs/results/bringup-test-gpu.svg is stale" in stale.stderr


def test_build_carries_shapes_by_the_evidence_it_cites(tmp_path):
    root = _tree(tmp_path)
    runs = root / "baselines" / "runs" / "bringup"
    runs.mkdir(parents=True)
    early = bench_result(runs / "gpu-withheld-a.json", {"s1": 0.8, "grid1": 0.5})
    late = bench_result(runs / "gpu-withheld-b.json", {"s1": 1.25})
    (runs / "sel.json").write_text(json.dumps(selected_report({"s1": True, "grid1": False})))
    (root / "baselines" / "bringup").mkdir()
    curve = root / "baselines" / "bringup" / "test-gpu.yaml"
    later = {**point(12.5, late), "carried": {"from": 0, "shapes": ["grid1"], "evidence": "sel.json"}}
    curve.write_text(yaml.safe_dump({"gpu": "Test GPU", "curves": [{"name": "c", "points": [point(0, early), later]}],
                                     "yardstick": {"name": "y", "runs": [early]}}))
    assert _build(root).returncode == 0, _build(root).stderr
    assert "| `grid1` | 0.50x | 0.50x† | 0.50x |" in (root / "docs" / "results" / "bringup-test-gpu.md").read_text()
    (runs / "sel.json").write_text(json.dumps(selected_report({"s1": True, "grid1": True})))
    moved = _build(root, "--check")
    assert moved.returncode == 2 and "`grid1` does not select the same configs in sel.json" in moved.stderr


def test_build_names_a_cited_run_that_is_not_there(tmp_path):
    root = _tree(tmp_path)
    (root / "baselines" / "bringup").mkdir()
    (root / "baselines" / "bringup" / "test-gpu.yaml").write_text(yaml.safe_dump({
        "gpu": "Test GPU", "curves": [{"name": "c", "points": [point(0, "gone.json")]}], "yardstick": {"name": "y"}}))
    done = _build(root, "--check")
    assert done.returncode == 2
    assert done.stderr.strip() == ("build.py: baselines/bringup/test-gpu.yaml: cites gone.json, which is not in "
                                   "baselines/runs/bringup/")


def test_build_names_a_yardstick_that_has_neither_runs_nor_a_baseline(tmp_path):
    root = _tree(tmp_path)
    runs = root / "baselines" / "runs" / "bringup"
    runs.mkdir(parents=True)
    run = bench_result(runs / "gpu-withheld-a.json", {"s1": 1.1})
    (root / "baselines" / "bringup").mkdir()
    (root / "baselines" / "bringup" / "other-gpu.yaml").write_text(yaml.safe_dump({
        "gpu": "Other GPU", "curves": [{"name": "c", "points": [point(0, run)]}], "yardstick": {"name": "y"}}))
    done = _build(root, "--check")
    assert done.returncode == 2
    assert done.stderr.strip() == ("build.py: baselines/bringup/other-gpu.yaml: the yardstick names no runs, and "
                                   "there is no baselines/other-gpu.yaml")
