"""mamba2_guard.core.results_page (pure rendering) and docs/results/build.py (write, --check)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import yaml

from mamba2_guard.core.results_page import groups, is_heldout, render

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "docs" / "results" / "build.py"
GLYPHS = "¶†‡§¤◊"


def case(ours: float, theirs: float | None, phase: str, recorded: str = "2026-01-01T00:00:00+00:00",
         **extra) -> dict:
    out = {"phase": phase, "recorded_at": recorded, "timing_method": "eager/v2", "roofline_fraction": 0.5,
           "helion": {"median_ms": ours, "n": 30},
           "precision": {"allclose": True, "finite": True, "max_rel_err_vs_fp64": 1e-7,
                         "mamba_ssm_max_rel_err_vs_fp64": 2e-7}}
    if theirs is not None:
        out["mamba_ssm"] = {"median_ms": theirs, "n": 30}
        out["speedup_vs_mamba_ssm"] = theirs / ours
    out.update(extra)
    return out


def baseline(results: dict) -> dict:
    return {"schema_version": 1, "fingerprint": {"gpu_name": "Test GPU", "driver_version": "1.2"},
            "results": results}


def table_rows(text: str, heading: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(heading)
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("| `"):
            rows.append(line)
    return rows


def test_rows_by_shape_composite_first_with_numbers_and_run():
    results = {"a_kernel": {"s1": case(0.5, 1.0, "fwd_1")},
               "whole_call": {"s1": case(2.0, 3.0, "call_fwd", recorded="2026-02-02T00:00:00+00:00")}}
    text = render(baseline(results), "test-gpu", runs={"2026-02-02T00:00:00+00:00": "test-gpu-run.json"},
                  tuned_shapes=["s1"])
    rows = table_rows(text, "## Shape `s1` (tuned)")
    assert [r.split("|")[1].strip() for r in rows] == ["`whole_call`", "`a_kernel`"]
    call = [c.strip() for c in rows[0].split("|")[1:-1]]
    assert call[:7] == ["`whole_call`", "call_fwd", "2.000", "3.000", "1.50x", "50 %", "pass"]
    assert "baselines/runs/test-gpu-run.json" in call[-1]
    kernel = [c.strip() for c in rows[1].split("|")[1:-1]]
    assert kernel[2:5] == ["0.500", "1.000", "2.00x"]
    assert kernel[-1] == "recorded 2026-01-01T00:00:00+00:00"  # no run file mapped: the row says when
    assert "Test GPU" in text and "driver 1.2" in text
    assert not any(g in text for g in GLYPHS)
    assert "no held-out shapes yet" in text
    assert "| `whole_call` | 1.50x |" in text  # the headline table of whole calls


def test_missing_peer_and_failed_precision_are_shown():
    bad = case(1.0, None, "fwd_2")
    bad["precision"]["allclose"] = False
    bad["roofline_fraction"] = None
    text = render(baseline({"k": {"s": bad}}), "x")
    cells = [c.strip() for c in table_rows(text, "## Shape `s`")[0].split("|")[1:-1]]
    assert cells[3:7] == ["n/a", "n/a", "n/a", "FAIL"]


def test_grouped_by_suite_when_rows_name_one_heldout_first():
    results = {"k": {"s1": case(1.0, 1.1, "fwd_1", suite="default"),
                     "z1": case(1.0, 1.2, "fwd_1", suite="zoo-heldout"),
                     "z2": case(1.0, 1.3, "fwd_1", suite="zoo-heldout")}}
    found = groups(results)
    assert [(kind, name, held) for kind, name, held, _ in found] == [("suite", "zoo-heldout", True),
                                                                      ("suite", "default", False)]
    text = render(baseline(results), "x", tuned_shapes=["s1"])
    assert text.index("## Suite `zoo-heldout` (held out)") < text.index("## Suite `default`")
    assert "### Shape `z1`" in text and "they are the claim" in text
    assert is_heldout({"heldout": True}) and not is_heldout({"suite": "default"})
    # a zoo suite is not held out by its name: the steered one was benched to decide changes
    assert not is_heldout({"suite": "zoo-steered"})


def test_steered_shapes_count_as_tuned_and_are_labelled_apart():
    from mamba2_guard.core import results_page

    call = {shape: case(1.0, theirs, "call_fwd_bwd") for shape, theirs in (("steer-a", 1.4), ("tuned-a", 2.0))}
    first = {"steer-a": {"entries": ["c"], "caches": "empty", "measured_at": "2026-12-04", "helion_s": 1.0,
                         "mamba_ssm_s": 2.0}}
    page = results_page.render(baseline({"ssd_combined_fwd_bwd": call}), "gpu", tuned_shapes=["tuned-a"],
                               heldout_shapes=["held-a"], steered_shapes=["steer-a"], first_calls=first)
    assert "The steered shapes (`steer-a`) were never tuned on, but were benched to decide" in page
    assert "The held-out shapes (`held-a`) have no rows yet: they are measured once, at the end" in page
    assert "| geometric mean of the speedups (range; shapes) | held out | steered | tuned |" in page
    assert "| `ssd_combined_fwd_bwd` | n/a | 1.40x (1.40-1.40x; 1) | 2.00x (2.00-2.00x; 1) |" in page
    assert "## Shape `steer-a` (steered)" in page and "| `steer-a` (steered) | c |" in page
    series = results_page.call_speedups(baseline({"ssd_combined_fwd_bwd": call}), ["tuned-a"], ["held-a"],
                                        steered_shapes=["steer-a"])
    assert series == {"ssd_combined_fwd_bwd": [("steer-a", "steered", 1.4), ("tuned-a", "tuned", 2.0)]}


def test_grouped_by_shape_when_a_row_names_no_suite():
    results = {"k": {"s1": case(1.0, 1.1, "fwd_1", suite="default"), "s2": case(1.0, 1.1, "fwd_1")}}
    assert [g[:2] for g in groups(results)] == [("shape", "s1"), ("shape", "s2")]


def _tree(tmp_path: Path) -> Path:
    """A temp copy of the repository's layout: the script, one baseline, one run, the suites."""
    (tmp_path / "docs" / "results").mkdir(parents=True)
    shutil.copy(BUILD, tmp_path / "docs" / "results" / "build.py")
    (tmp_path / "baselines" / "runs").mkdir(parents=True)
    (tmp_path / "mamba2_kernels").mkdir()
    tiny = {"batch": 1, "seqlen": 64, "nheads": 4, "headdim": 8, "ngroups": 2, "dstate": 8, "chunk_size": 16,
            "dtype": "float32"}
    (tmp_path / "mamba2_kernels" / "suites.yaml").write_text(yaml.safe_dump({
        "shapes": {"s1": tiny, "grid1": {**tiny, "call": {"z": True}}},
        "suites": {"default": ["s1"], "zoo-fit": ["grid1"]}}))
    results = {"k": {"s1": case(0.5, 1.0, "fwd_1", recorded="2026-03-03T00:00:00+00:00")}}
    (tmp_path / "baselines" / "test-gpu.yaml").write_text(yaml.safe_dump(baseline(results)))
    (tmp_path / "baselines" / "runs" / "test-gpu-2026-03-03-bench.json").write_text(
        '{"schema_version": 1, "started_at": "2026-03-03T00:00:00+00:00", "cases": []}')
    return tmp_path


def _build_script(root: Path, *args: str) -> subprocess.CompletedProcess:
    """The tree's build.py as CI runs it, in its own process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(root / "docs" / "results" / "build.py"), *args], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120)


def _build(root: Path, *args: str) -> types.SimpleNamespace:
    """build.py's ``main`` on the tree, in this process: the same run as ``_build_script`` without a fresh
    interpreter importing torch for the launches-and-bytes page each time."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location("results_build", BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = module.main([*args, "--root", str(root)])
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_build_writes_then_check_passes_and_catches_an_edit(tmp_path):
    root = _tree(tmp_path)
    page = root / "docs" / "results" / "test-gpu.md"
    assert _build_script(root, "--check").returncode == 1  # no page yet
    done = _build_script(root)
    assert done.returncode == 0, done.stderr
    assert "test-gpu-2026-03-03-bench.json" in page.read_text()
    assert "were tuned at shapes among `s1`, `grid1`." in page.read_text()  # the grid's points are tuned too
    fresh = _build(root, "--check")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    page.write_text(page.read_text().replace("2.00x", "2.10x"))
    stale = _build(root, "--check")
    assert stale.returncode == 1
    assert "docs/results/test-gpu.md is stale" in stale.stderr


def test_shapes_of_the_held_out_suite_come_first_as_the_claim():
    from mamba2_guard.core import results_page

    case = {"phase": "call_fwd", "samples_ms": {"helion": [1.0], "mamba_ssm": [2.0]}}
    baseline = {"results": {"ssd_combined_fwd": {"nemotron3-nano": dict(case), "bamba-9b": dict(case)}}}
    page = results_page.render(baseline, "gpu", tuned_shapes=["nemotron3-nano"], heldout_shapes=["bamba-9b"])
    assert "Held-out groups (`bamba-9b`)" in page
    assert page.index("## Shape `bamba-9b` (held out)") < page.index("## Shape `nemotron3-nano` (tuned)")
    assert "no held-out shapes yet" in results_page.render(baseline, "gpu", tuned_shapes=["nemotron3-nano"])


def test_the_whole_calls_geometric_means_over_held_out_and_tuned_shapes():
    from mamba2_guard.core import results_page

    call = {shape: case(1.0, theirs, "call_fwd_bwd")
            for shape, theirs in (("held-a", 1.2), ("held-b", 1.5), ("tuned-a", 2.0), ("other", 9.0))}
    results = {"ssd_combined_fwd_bwd": call, "chunk_scan": {"held-a": case(1.0, 3.0, "fwd")}}
    page = results_page.render(baseline(results), "gpu", tuned_shapes=["tuned-a"], heldout_shapes=["held-a", "held-b"])
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    # sqrt(1.2 * 1.5) = 1.34; a shape in neither group and a single kernel count nowhere
    assert "| `ssd_combined_fwd_bwd` | 1.34x (1.20-1.50x; 2) | 2.00x (2.00-2.00x; 1) |" in rows
    assert not any(line.startswith("| `chunk_scan` | 3.00x") for line in rows)
    assert "geometric mean" not in results_page.render(baseline(results), "gpu", tuned_shapes=["tuned-a"])


def test_first_calls_are_shown_held_out_first_with_their_ratio_and_run():
    from mamba2_guard.core import results_page

    record = {"entries": ["ssd_combined_fwd_bwd"], "caches": "empty", "measured_at": "2026-12-04T20:09:35+00:00"}
    first_calls = {"tuned-a": {**record, "helion_s": 30.0, "mamba_ssm_s": 60.0},
                   "held-a": {**record, "helion_s": 40.0, "mamba_ssm_s": 100.0, "log": "gpu-run.log"}}
    results = {"ssd_combined_fwd_bwd": {"held-a": case(1.0, 1.2, "call_fwd_bwd")}}
    page = results_page.render(baseline(results), "gpu", tuned_shapes=["tuned-a"], heldout_shapes=["held-a"],
                               first_calls=first_calls)
    table = table_rows(page, "## First call at a shape")
    assert len(table) == 2
    assert table[0].startswith(
        "| `held-a` (held out) | ssd_combined_fwd_bwd | 40.0 | 100.0 | 0.40 | empty | 2026-12-04 |")
    assert "[`gpu-run.log`](../../baselines/runs/gpu-run.log)" in table[0]
    assert table[1].startswith("| `tuned-a` (tuned) | ssd_combined_fwd_bwd | 30.0 | 60.0 | 0.50 |")
    assert "## First call" not in results_page.render(baseline(results), "gpu")


def test_the_chart_data_is_each_calls_speedups_held_out_first():
    from mamba2_guard.core import results_page

    call = {shape: case(1.0, theirs, "call_fwd_bwd")
            for shape, theirs in (("tuned-a", 2.0), ("held-b", 1.5), ("held-a", 1.2), ("other", 9.0))}
    results = {"ssd_combined_fwd_bwd": call, "chunk_scan": {"held-a": case(1.0, 3.0, "fwd")}}
    series = results_page.call_speedups(baseline(results), ["tuned-a"], ["held-a", "held-b"])
    assert series == {"ssd_combined_fwd_bwd": [("held-a", "held out", 1.2), ("held-b", "held out", 1.5),
                                               ("tuned-a", "tuned", 2.0)]}


def test_build_draws_the_chart_embeds_it_and_check_catches_stale_data(tmp_path):
    """The page embeds an SVG chart drawn by matplotlib; --check compares the data it was drawn from (which
    the SVG carries), so a baseline change with an old chart is stale."""
    root = _tree(tmp_path)
    results = {"ssd_combined_fwd_bwd": {"s1": case(1.0, 1.3, "call_fwd_bwd"), "grid1": case(1.0, 1.1, "call_fwd_bwd")}}
    (root / "baselines" / "test-gpu.yaml").write_text(yaml.safe_dump(baseline(results)))
    assert _build(root).returncode == 0
    chart = root / "docs" / "results" / "test-gpu-speedups.svg"
    svg = chart.read_text()
    assert svg.startswith("<?xml") and "<svg" in svg and "grid1" in svg and "1.30x" in svg
    assert "held-out shapes apart, and of the first call](test-gpu-speedups.svg)" in (
        root / "docs" / "results" / "test-gpu.md").read_text()
    assert _build(root, "--check").returncode == 0
    results["ssd_combined_fwd_bwd"]["s1"] = case(1.0, 1.4, "call_fwd_bwd")
    (root / "baselines" / "test-gpu.yaml").write_text(yaml.safe_dump(baseline(results)))
    page = root / "docs" / "results" / "test-gpu.md"
    page.write_text(_build_text(root, page))  # the page alone brought up to date: the chart is still stale
    stale = _build(root, "--check")
    assert stale.returncode == 1 and "docs/results/test-gpu-speedups.svg is stale" in stale.stderr


def _build_text(root: Path, page: Path) -> str:
    """The page as build.py would write it now, without touching the chart."""
    saved = {p: p.read_bytes() for p in page.parent.glob("*.svg")}
    assert _build(root).returncode == 0
    text = page.read_text()
    for p, data in saved.items():
        p.write_bytes(data)
    return text


def test_the_chart_has_a_panel_of_the_first_calls_speedups():
    from mamba2_guard.core import results_page

    call = {"tuned-a": case(1.0, 2.0, "call_fwd_bwd")}
    first = {"held-a": {"helion_s": 50.0, "mamba_ssm_s": 100.0}, "tuned-a": {"helion_s": 40.0, "mamba_ssm_s": 60.0},
             "elsewhere": {"helion_s": 1.0, "mamba_ssm_s": 9.0}}
    series = results_page.call_speedups(baseline({"ssd_combined_fwd_bwd": call}), ["tuned-a"], ["held-a"], first)
    assert series[results_page.FIRST_CALL_PANEL] == [("held-a", "held out", 2.0), ("tuned-a", "tuned", 1.5)]
    assert results_page.FIRST_CALL_PANEL not in results_page.call_speedups(
        baseline({"ssd_combined_fwd_bwd": call}), ["tuned-a"], ["held-a"])


def test_build_writes_the_launches_and_bytes_page_from_the_traffic_model(tmp_path):
    from mamba2_kernels import suites
    from mamba2_kernels.registry.calls import call_traffic

    root = _tree(tmp_path)
    assert _build(root).returncode == 0
    page = (root / "docs" / "results" / "traffic.md").read_text()
    loaded = suites.load(root / "mamba2_kernels" / "suites.yaml")
    fwd, both = call_traffic(loaded.shape("grid1"), False), call_traffic(loaded.shape("grid1"), True)
    assert (f"| `grid1` (tuned) | 5 / 4 / 2 | {fwd.mamba_ssm_bytes / 1e9:.2f} / {fwd.bytes / 1e9:.2f} / "
            f"{fwd.fused_bytes / 1e9:.2f} |") in page
    # with z, every backward launches the dz stage too
    assert f"| `grid1` (tuned) | {both.mamba_ssm_launches} / {both.launches} / {both.fused_launches} |" in page
    assert (f"| {fwd.mamba_ssm_flops / 1e9:.1f} / {fwd.flops / 1e9:.1f} / {fwd.fused_flops / 1e9:.1f} |"
            in page.split("## Forward + backward")[0])
    assert (both.mamba_ssm_launches, both.launches, both.fused_launches) == (20, 16, 9)
    assert page.index("## Forward") < page.index("## Forward + backward")
    assert _build(root, "--check").returncode == 0
