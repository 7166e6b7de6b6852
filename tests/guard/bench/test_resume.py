"""A bench that stops early keeps what it measured, and ``bench --resume`` measures only the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mamba2_guard.bench.run import _line, run_bench
from mamba2_guard.core.results import BenchResult, CaseResult, kept_on_resume
from mamba2_kernels import registry

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(sys.executable).parent / "mamba2-guard"
FINGERPRINT = {"gpu_name": "NVIDIA H200", "gpu_uuid": "GPU-1", "driver_version": "580", "torch": "2.11",
               "timing_method": "v2"}
SETTINGS = {"seed": 0, "rounds": 20, "cuda_graphs": False}


def prior(*cases: CaseResult) -> BenchResult:
    return BenchResult(fingerprint=dict(FINGERPRINT), cases=cases, started_at="2026-12-04T10:00:00+00:00",
                       extra=dict(SETTINGS))


def case(kernel: str, **fields) -> CaseResult:
    return CaseResult(kernel=kernel, shape="smoke", phase="fwd", **fields)  # the smoke suite's shape


def test_a_resumed_run_keeps_the_cases_that_were_measured():
    good, failed, missing, throttled = case("a"), case("b", error="boom"), case("c", missing=True), case(
        "d", throttled=True)
    planned = {("smoke", kernel) for kernel in "abcd"}
    assert kept_on_resume(prior(good, failed, missing, throttled), FINGERPRINT, SETTINGS, planned) == (good,)


def test_a_resumed_run_of_fewer_shapes_keeps_every_case_outside_them_as_it_was():
    elsewhere = [CaseResult(kernel="a", shape="other", phase="fwd", error=error) for error in (None, "boom")]
    here = case("a", error="boom")
    assert kept_on_resume(prior(*elsewhere, here), FINGERPRINT, SETTINGS, {("smoke", "a")}) == tuple(elsewhere)


def test_the_progress_line_says_a_throttled_case_is_measured_again():
    assert "throttled, so no baseline row (--resume measures it again)" in _line(0, 1, case("a", throttled=True), 1.0)
    assert "throttled" not in _line(0, 1, case("a"), 1.0)


@pytest.mark.parametrize(("changed", "says"), [
    ({"settings": {**SETTINGS, "seed": 1}}, "measured with seed 0, this run has 1"),
    ({"settings": {**SETTINGS, "cuda_graphs": True}}, "measured with cuda_graphs False, this run has True"),
    ({"fingerprint": {**FINGERPRINT, "gpu_uuid": "GPU-2"}}, "measured on GPU GPU-1, this run is on GPU-2"),
    ({"fingerprint": {**FINGERPRINT, "torch": "2.12"}}, "measured in another environment"),
])
def test_a_run_under_other_conditions_does_not_resume(changed, says):
    with pytest.raises(ValueError, match=says):
        kept_on_resume(prior(case("a")), changed.get("fingerprint", FINGERPRINT), changed.get("settings", SETTINGS),
                       {("smoke", "a")})


def bench(entries, shape, **kwargs) -> BenchResult:
    return run_bench([registry.get(name) for name in entries], [shape], fingerprint={"gpu_name": None},
                     fingerprint_digest="cpu", state_dir=Path("unused"), suite=None, progress=lambda _: None, **kwargs)


@pytest.mark.slow
def test_each_case_is_checkpointed_partial_until_the_last(smoke_shape):
    seen: list[BenchResult] = []
    final = bench(["chunk_cumsum", "chunk_state"], smoke_shape, checkpoint=seen.append)
    assert [r.extra.get("partial") for r in seen] == [{"cases": 1, "planned": 2}, None]
    assert [c.kernel for c in seen[0].cases] == ["chunk_cumsum"]
    assert seen[-1] == final and "partial" not in final.extra


@pytest.mark.slow
def test_cases_measured_before_are_kept_as_they_are_and_in_plan_order(smoke_shape):
    before = case("chunk_state", extra={"measured": "earlier"})
    result = bench(["chunk_cumsum", "chunk_state"], smoke_shape, done=[before], started_at="then")
    assert [c.kernel for c in result.cases] == ["chunk_cumsum", "chunk_state"]
    assert result.cases[1] is before and result.cases[0].precision is not None
    assert result.started_at == "then" and "partial" not in result.extra


@pytest.mark.slow
def test_a_resume_of_fewer_shapes_writes_the_cases_of_the_others_first(smoke_shape):
    other = CaseResult(kernel="chunk_cumsum", shape="other", phase="fwd", extra={"measured": "earlier"})
    lines: list[str] = []
    result = run_bench([registry.get("chunk_cumsum")], [smoke_shape], fingerprint={"gpu_name": None},
                       fingerprint_digest="cpu", state_dir=Path("unused"), suite=None, progress=lines.append,
                       done=[other], started_at="then")
    assert [(c.shape, c.kernel) for c in result.cases] == [("other", "chunk_cumsum"), ("smoke", "chunk_cumsum")]
    assert result.cases[0] is other and "partial" not in result.extra
    assert "resumed: 1 of 2 case(s) measured before, 1 to go (1 outside this selection, kept as they were)" in lines


def guard(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_resume_needs_the_file_to_continue(tmp_path):
    done = guard("bench", "--kernels", "chunk_cumsum", "--resume", "--state-dir", str(tmp_path))
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "mamba2-guard: --resume: needs --json PATH, the result file to continue"], done.stderr


@pytest.mark.slow
def test_a_killed_bench_keeps_its_cases_and_resume_measures_the_rest(tmp_path):
    out, state = tmp_path / "result.json", str(tmp_path / "state")
    kernels = ["--kernels", "chunk_cumsum", "chunk_state", "bmm_chunk", "--shapes", "smoke"]
    run = subprocess.Popen([str(SCRIPT), "bench", *kernels, "--json", str(out), "--state-dir", state], cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not out.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    stopped = BenchResult.from_dict(json.loads(out.read_text()))
    assert stopped.extra["partial"] == {"cases": 1, "planned": 3}, stopped.extra
    assert [c.kernel for c in stopped.cases] == ["chunk_cumsum"]

    wrong_seed = guard("bench", *kernels, "--json", str(out), "--state-dir", state, "--resume", "--seed", "1")
    assert wrong_seed.returncode == 2, wrong_seed.stderr
    assert wrong_seed.stderr.strip() == (f"mamba2-guard: --resume: {out}: measured with seed 0, this run has 1")

    resumed = guard("bench", *kernels, "--json", str(out), "--state-dir", state, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed: 1 of 3 case(s) measured before, 2 to go" in resumed.stderr
    final = BenchResult.from_dict(json.loads(out.read_text()))
    assert [c.kernel for c in final.cases] == ["chunk_cumsum", "chunk_state", "bmm_chunk"]
    assert final.cases[0] == stopped.cases[0] and final.started_at == stopped.started_at
    assert "partial" not in final.extra


def test_resume_names_a_file_that_is_no_result(tmp_path):
    broken = tmp_path / "result.json"
    broken.write_text("{not json")
    done = guard("bench", "--kernels", "chunk_cumsum", "--json", str(broken), "--resume", "--state-dir", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"mamba2-guard: --resume: {broken}: not a bench result")
    assert "Traceback" not in done.stderr and broken.read_text() == "{not json"
