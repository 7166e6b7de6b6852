"""``mamba2-guard dev record-results``: bench results made on another machine go into this checkout's baseline
as ``bench --update-baseline`` would have put them there; a file that is no result is named, and nothing is
written. The real console script runs in a subprocess, on a copy of the committed baseline."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
BASELINE = ROOT / "baselines" / "nvidia-h200.yaml"
SHAPE = "bamba-9b"


def _cited_run() -> tuple[Path, tuple[str, ...]]:
    """A committed run file whose every case is a row of the baseline at SHAPE, and those rows' kernels. Found
    through the rows' recorded_at, since run files are removed once no row cites them."""
    rows = yaml.safe_load(BASELINE.read_text())["results"]
    cited = {kernel: str(by_shape[SHAPE]["recorded_at"]) for kernel, by_shape in rows.items() if SHAPE in by_shape}
    for path in sorted((ROOT / "baselines" / "runs").glob("nvidia-h200-*.json")):
        result = json.loads(path.read_text())
        cases = {(case["kernel"], case["shape"]) for case in result["cases"]}
        if cases and all(shape == SHAPE and cited.get(kernel) == result["started_at"] for kernel, shape in cases):
            return path, tuple(sorted(kernel for kernel, _ in cases))
    raise AssertionError(f"no committed run file holds only rows of the baseline at {SHAPE}")


RUN, ROWS = _cited_run()


def _record(root: Path, *results: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mamba2_guard", "dev", "record-results", *map(str, results), "--root",
                           str(root)], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _checkout_without_the_rows(tmp_path: Path) -> Path:
    (tmp_path / "baselines").mkdir()
    baseline = tmp_path / "baselines" / "nvidia-h200.yaml"
    doc = yaml.safe_load(BASELINE.read_text())
    for kernel in ROWS:
        del doc["results"][kernel][SHAPE]
    baseline.write_text(yaml.safe_dump(doc))
    return baseline


def test_a_result_from_elsewhere_restores_its_rows_and_keeps_the_others(tmp_path):
    baseline = _checkout_without_the_rows(tmp_path)
    done = _record(tmp_path, RUN)
    assert done.returncode == 0, done.stderr
    assert f"{RUN}: {len(ROWS)} case(s) into {baseline}" in done.stdout
    committed = yaml.safe_load(BASELINE.read_text())["results"]
    recorded = yaml.safe_load(baseline.read_text())["results"]
    assert recorded == committed  # the rows as the device wrote them, every other row as it was


def test_a_file_that_is_no_result_is_named_and_nothing_is_written(tmp_path):
    baseline = _checkout_without_the_rows(tmp_path)
    before = baseline.read_text()
    broken = tmp_path / "broken.json"
    broken.write_text("{oops")
    shutil.copy(RUN, tmp_path / "good.json")
    done = _record(tmp_path, tmp_path / "good.json", broken)  # the good file is not written either
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{broken}: not a bench result" in done.stderr and baseline.read_text() == before
    missing = _record(tmp_path, tmp_path / "none.json")
    assert missing.returncode == 2 and "none.json: cannot read the bench result" in missing.stderr
