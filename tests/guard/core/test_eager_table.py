"""mamba2_guard.core.eager_table (the eager-loop page, pure) and its part of docs/results/build.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mamba2_guard.core import eager_table
from tests.guard.core.test_results_page import _build, _tree


def result(ours: float, theirs: float, device: float, compiled: float | None = None) -> dict:
    wall = theirs / ours
    return {"wall": {"median_ms": {"helion": ours, "mamba_ssm": theirs}, "speedup_vs_mamba_ssm": wall,
                     **({} if compiled is None else {"compiled_vs_eager": compiled})},
            "device": {"median_ms": {"helion": 1.0, "mamba_ssm": device}, "speedup_vs_mamba_ssm": device},
            "host_cost": round(1 - wall / device, 4)}


REPORT = {"date": "2026-03-03", "rounds": 5, "steps": 20,
          "fingerprint": {"gpu_name": "Test GPU", "gpu_uuid": "GPU-0000aaaa-1111", "helion": "9.9"},
          "cases": {"s1": {"ssd_combined_fwd": result(1.0, 1.5, 1.6),
                           "ssd_combined_fwd_bwd": result(2.0, 2.6, 1.4)},  # 1.30x, 7 % below the device's
                    "s1@L1024": {"ssd_combined_fwd_bwd": result(1.0, 1.1, 1.5)},  # 1.10x, host cost not judged
                    "s2": {"ssd_combined_fwd_bwd": result(2.0, 2.04, 1.05)},  # 1.02x, within 5 %
                    "s2@L2048": {"ssd_combined_fwd_bwd": result(1.0, 0.9, 1.2)},  # slower in the eager loop
                    "s3": {"ssd_combined_fwd_bwd": {"error": "OutOfMemoryError: no room"}},
                    "grid1": {"ssd_combined_fwd_bwd": result(1.0, 1.2, 1.2)},
                    "s4": {"ssd_combined_fwd_bwd": result(1.0, 1.2, 1.2, compiled=0.83)},  # shown, not judged
                    "s4@L1024": {"ssd_combined_fwd_bwd": result(1.0, 1.2, 1.2, compiled=1.02)}}}


def test_the_step_targets_are_judged_per_row_and_the_forward_alone_is_not():
    """A call compiled alone is a graph of its own, with the per-graph costs a model pays once: its compiled
    ratio is shown, and the compile target is judged on a whole block (below)."""
    verdicts = {(r.shape, r.call): eager_table.verdict(r) for r in eager_table.rows(REPORT, "run.json")}
    assert verdicts == {("s1", "ssd_combined_fwd"): "",
                        ("s1", "ssd_combined_fwd_bwd"): "host cost 7% > 5%",
                        ("s1@L1024", "ssd_combined_fwd_bwd"): "met",
                        ("s2", "ssd_combined_fwd_bwd"): "met",
                        ("s2@L2048", "ssd_combined_fwd_bwd"): "0.90x < 1.0x",
                        ("s3", "ssd_combined_fwd_bwd"): "not measured",
                        ("grid1", "ssd_combined_fwd_bwd"): "met",
                        ("s4", "ssd_combined_fwd_bwd"): "met",
                        ("s4@L1024", "ssd_combined_fwd_bwd"): "met"}


@pytest.mark.parametrize(("doc", "message"), [
    ({"gpu": "G"}, "eager.yaml.runs: expected a list of {file, note}, got None"),
    ({"gpu": "G", "runs": [{"file": "a.json"}]}, "eager.yaml.runs[0].note: expected text, got None"),
    ({"gpu": "G", "runs": [{"file": "a.json", "note": "n"}], "rows": []}, "eager.yaml: unknown field(s) ['rows']"),
    ({"runs": [{"file": "a.json", "note": "n"}]}, "eager.yaml.gpu: expected text, got None"),
])
def test_a_malformed_eager_file_is_an_error_naming_the_field(doc, message):
    with pytest.raises(ValueError) as raised:
        eager_table.parse(doc, "eager.yaml")
    assert str(raised.value) == message


def test_a_report_that_is_not_dev_eager_steps_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"^run.json: not a dev eager-step report"):
        eager_table.rows({"schema_version": 1, "cases": []}, "run.json")
    with pytest.raises(ValueError, match=r"^run.json: cases.s1.ssd_combined_bwd: expected one of"):
        eager_table.rows({"cases": {"s1": {"ssd_combined_bwd": {}}}}, "run.json")


def block_report(compiled: dict | None = None) -> dict:
    """A ``dev module-bench`` report: the block 1.25x mamba-ssm's forward, 1.10x its training step."""
    phase = {"fwd": 1.25, "fwd_bwd": 1.10}
    return {"date": "2026-03-03", "rounds": 5, "steps": 10, "shape": "s1", "d_model": 2688,
            "fingerprint": {"gpu_name": "Test GPU", "gpu_uuid": "GPU-0000aaaa-1111", "helion": "9.9"},
            **{name: {"speedup_vs_mamba_ssm": ratio, "gemm_share": {"helion": 0.4, "mamba_ssm": 0.35}}
               for name, ratio in phase.items()},
            **({} if compiled is None else {"compiled_step": compiled})}


@pytest.mark.parametrize(("compiled", "verdict"), [
    (None, "not compiled"),
    ({"median_ms": {"eager": 3.0, "compiled": 3.6}, "compiled_vs_eager": 0.83}, "compiled 0.83x of eager"),
    ({"mode": "reduce-overhead", "median_ms": {"eager": 3.0, "compiled": 2.0}, "compiled_vs_eager": 1.5}, "met"),
    ({"mode": "default", "median_ms": {}}, "not measured"),
    ({"mode": "reduce-overhead", "error": "RuntimeError: These storage data ptrs are not allocated in pool",
      "traceback": "..."}, "failed: RuntimeError: These storage data ptrs are not allocated in pool"),
])
def test_a_whole_blocks_compiled_step_is_judged_against_its_eager_one(compiled, verdict):
    run = eager_table.block(block_report(compiled), "block.json")
    assert (run.shape, run.d_model, run.forward, run.step, run.gemm_share) == ("s1", 2688, 1.25, 1.10, 0.4)
    assert run.mode == (None if compiled is None else compiled.get("mode", "default"))  # runs before modes: default
    assert eager_table.block_verdict(run) == verdict


def test_a_block_report_without_its_phases_is_an_error_naming_it():
    assert eager_table.is_block_report(block_report()) and not eager_table.is_block_report(REPORT)
    with pytest.raises(ValueError, match=r"^block.json: not a dev module-bench report"):
        eager_table.block({"shape": "s1", "d_model": 64, "fwd": {}}, "block.json")


def _eager_tree(tmp_path: Path, runs: list[str]) -> Path:
    root = _tree(tmp_path)
    (root / "baselines" / "runs" / "eager").mkdir(parents=True)
    (root / "baselines" / "eager").mkdir()
    (root / "baselines" / "eager" / "test-gpu.yaml").write_text(yaml.safe_dump(
        {"gpu": "Test GPU", "note": "A test.", "runs": [{"file": run, "note": "The code of then."} for run in runs]}))
    return root


def test_build_renders_the_eager_page_from_the_runs_it_cites_and_check_catches_a_stale_page(tmp_path):
    root = _eager_tree(tmp_path, ["test-gpu-eager.json"])
    run = root / "baselines" / "runs" / "eager" / "test-gpu-eager.json"
    run.write_text(json.dumps(REPORT))
    assert _build(root).returncode == 0
    page = (root / "docs" / "results" / "eager-test-gpu.md").read_text()
    assert "Test GPU (GPU-0000aaaa), 2026-03-03; helion 9.9; 5 rounds of 20 calls. The code of then." in page
    assert "| `s1` | forward + backward | 2.000 | 2.600 | 1.30x | 1.40x | 7% |  | host cost 7% > 5% |" in page
    assert "| `s3` | forward + backward | failed: OutOfMemoryError: no room |  |  |  |  |  | not measured |" in page
    assert "| `s4` | forward + backward | 1.000 | 1.200 | 1.20x | 1.20x | 0% | 0.83x | met |" in page
    # the suites' shapes first, in their order (s1, then grid1), then the others by name; each shape before
    # its other lengths
    assert (page.index("| `s1` | forward |") < page.index("| `s1@L1024` |") < page.index("| `grid1` |")
            < page.index("| `s2` |") < page.index("| `s2@L2048` |"))
    assert _build(root, "--check").returncode == 0
    run.write_text(json.dumps({**REPORT, "date": "2026-03-04"}))
    stale = _build(root, "--check")
    assert stale.returncode == 1 and "docs/results/eager-test-gpu.md is stale" in stale.stderr


def test_build_renders_a_cited_block_run_as_a_section_of_its_own(tmp_path):
    root = _eager_tree(tmp_path, ["test-gpu-eager.json", "test-gpu-block.json"])
    (root / "baselines" / "runs" / "eager" / "test-gpu-eager.json").write_text(json.dumps(REPORT))
    compiled = {"mode": "reduce-overhead", "median_ms": {"eager": 3.0, "compiled": 2.0}, "compiled_vs_eager": 1.5}
    (root / "baselines" / "runs" / "eager" / "test-gpu-block.json").write_text(json.dumps(block_report(compiled)))
    assert _build(root).returncode == 0
    page = (root / "docs" / "results" / "eager-test-gpu.md").read_text()
    assert "## `test-gpu-block.json`: the whole `Mamba2` block" in page
    assert ("| `s1` | 2688 | 1.25x | 1.10x | 40% | `reduce-overhead` | 3.000 | 2.000 | 1.50x | met |"
            in page.split("## `test-gpu-block.json`")[1])


def test_build_names_a_cited_eager_run_that_is_not_there(tmp_path):
    root = _eager_tree(tmp_path, ["gone.json"])
    done = _build(root, "--check")
    assert done.returncode == 2
    assert done.stderr.strip() == ("build.py: baselines/eager/test-gpu.yaml: cites gone.json, which is not in "
                                   "baselines/runs/eager/")
