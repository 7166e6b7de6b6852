"""mamba2_guard.dev.sweep (``mamba2-guard dev sweep``): hand-picked configs against the stored one. The spec checks,
the config overlay and the report are pure; the run is checked on the CPU (Triton's interpreter, untimed)
in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mamba2_guard.dev import sweep as config_sweep

COMMAND = [sys.executable, "-m", "mamba2_guard", "dev", "sweep"]

JOB = {"entry": "chunk_cumsum", "kernel": "chunk_cumsum", "shapes": ["smoke"], "variants": [{"num_warps": 2}]}


@pytest.mark.parametrize(("raw", "message"), [
    ([], "spec: expected a non-empty JSON list"),
    ([{**JOB, "extra": 1}], "spec[0]: expected an object with exactly entry, kernel, shapes and variants"),
    ([{**JOB, "entry": "nope"}], "spec[0].entry: expected a registry entry, got 'nope'"),
    ([JOB, {**JOB, "shapes": ["huge"]}], "spec[1].shapes: expected a non-empty list of"),
    ([{**JOB, "shapes": [{"seqlen": 64}]}], "spec[0].shapes: expected a non-empty list of"),
    ([{**JOB, "variants": [{}]}], "spec[0].variants: expected a list of non-empty config objects"),
])
def test_a_bad_spec_names_the_field(raw, message):
    with pytest.raises(ValueError) as caught:
        config_sweep.parse_spec(raw)
    assert message in str(caught.value)


def test_overlay_lays_the_variant_over_the_stored_config_and_spreads_an_indexing_string():
    stored = {"block_sizes": [64, 64], "num_warps": 2, "indexing": ["pointer"] * 3}
    config = config_sweep.overlay(stored, {"num_warps": 4, "indexing": "tensor_descriptor"})
    assert config == {"block_sizes": [64, 64], "num_warps": 4, "indexing": ["tensor_descriptor"] * 3}
    assert stored["num_warps"] == 2  # not modified
    assert config_sweep.overlay(stored, {"indexing": ["pointer", "block_ptr", "pointer"]})["indexing"][1] == "block_ptr"


def test_report_lists_variants_fastest_first_against_the_stored_config():
    result = {"entry": "e", "kernel": "k", "shape": "s", "medians_ms": {"mamba_ssm": 0.3, "ours": 0.25},
              "variants": [{"variant": "stored", "median_ms": 0.25},
                           {"variant": '{"num_warps":4}', "median_ms": 0.2, "max_rel_diff_vs_stored": 1e-7},
                           {"variant": '{"block_sizes":[3]}', "invalid": "not a power of two"}]}
    lines = config_sweep.report(result).splitlines()
    assert lines[0] == "== e / k @ s: mamba-ssm 0.3000 ms, ours 0.2500 ms (1.200x)"
    assert lines[1].split() == ["0.2000", "ms", "(1.250x", "of", "stored)", '{"num_warps":4}', "max_rel_diff_vs_stored",
                                "1.00e-07"]
    assert lines[2].split()[:3] == ["0.2500", "ms", "(1.000x"]
    assert lines[3].strip() == '{"block_sizes":[3]}'.join(["untimed  ", "  invalid: not a power of two"])


def _run(tmp_path: Path, spec: list) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "sweep.json"
    done = subprocess.run([*COMMAND, str(tmp_path / "spec.json"), "--out", str(out), "--device",
                           "cpu"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    return done, out


def test_cpu_run_applies_each_variant_and_reports_invalid_ones(tmp_path):
    variants = [{"block_sizes": [2], "num_warps": 2}, {"block_sizes": [3]}]
    done, out = _run(tmp_path, [{**JOB, "variants": variants}])
    assert done.returncode == 0, done.stderr[-2000:]
    (result,) = json.loads(out.read_text())
    assert result["medians_ms"] is None and result["key"].startswith("bias=1,chunk_size=32")
    stored, small, odd = result["variants"]
    assert stored["variant"] == "stored" and "max_rel_diff_vs_stored" not in stored
    assert small["config"]["block_sizes"] == [2] and small["config"]["num_warps"] == 2
    assert small["config"]["indexing"] == stored["config"]["indexing"]
    # heads are independent in chunk_cumsum: a smaller head block changes no bit
    assert small["max_rel_diff_vs_stored"] == 0.0
    assert "power of two" in odd["invalid"] and "max_rel_diff_vs_stored" not in odd
    assert "== chunk_cumsum / chunk_cumsum @ smoke" in done.stdout


def test_a_kernel_the_entry_does_not_launch_is_named(tmp_path):
    done, _ = _run(tmp_path, [{**JOB, "kernel": "chunk_scan"}])
    assert done.returncode == 2
    assert "chunk_cumsum: kernel: chunk_cumsum launches ['chunk_cumsum'], not 'chunk_scan'" in done.stderr


def test_a_run_cut_short_while_rewriting_the_file_keeps_the_shapes_before(tmp_path):
    """The file is rewritten after each shape; a kill or a full disk during a rewrite (here: a file size limit
    that the second shape's rewrite passes) keeps the first shape's results."""
    import resource

    one, out = _run(tmp_path, [JOB])
    assert one.returncode == 0, one.stderr[-2000:]
    first = out.read_text()
    spec, cut = tmp_path / "twice.json", tmp_path / "cut.json"
    spec.write_text(json.dumps([{**JOB, "shapes": ["smoke", "smoke"]}]))

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(first) + 10, resource.RLIM_INFINITY))

    done = subprocess.run([*COMMAND, str(spec), "--out", str(cut), "--device", "cpu"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TRITON_INTERPRET": "1"}, preexec_fn=small_disk)
    assert done.returncode == 2 and f"{cut}: File too large" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert cut.read_text() == first
