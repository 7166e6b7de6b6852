"""The autotune orchestrator with a fake tuner: child processes, hard timeouts, resume, sharding,
never shipping a slower config. No GPU."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mamba2_guard.core import tuneplan
from mamba2_guard.flows import autotune
from mamba2_guard.flows.autotune import AutotuneOptions, run_autotune
from mamba2_kernels import config_store
from tests.guard.flows import fake_tuner

FAKE = str(Path(__file__).with_name("fake_tuner.py")) + ":tune"
ROOT = Path(__file__).resolve().parents[3]
KERNELS = ["chunk_cumsum", "chunk_state", "state_passing"]
SHAPES = ["smoke", "mamba2-default"]
BASE = [1.00 + 0.002 * (i % 9) for i in range(30)]


def options(tmp_path: Path, **kw) -> AutotuneOptions:
    defaults = dict(kernels=KERNELS, shapes=SHAPES, out=tmp_path / "configs" / "fake.yaml",
                    state_dir=tmp_path / "state", gpu_slug="fake", fingerprint={"helion": "9.9"},
                    fingerprint_digest="d" * 64, budget_seconds=5, tuner=FAKE, devices=("0",))
    defaults.update(kw)
    return AutotuneOptions(**defaults)


def quiet(_message: str) -> None:
    pass


def test_a_job_killed_at_its_timeout_keeps_the_launches_it_finished_and_its_retry_tunes_the_rest(tmp_path):
    def launch(kernel):
        return {"kernel": kernel, "key": "shape=smoke", "config": {"block_sizes": [32], "num_warps": 4},
                "incumbent": "default", "incumbent_config": {"block_sizes": [16], "num_warps": 2},
                "precision": {"ok": True}, "samples_ms": {"incumbent": BASE, "candidate": [0.9 * x for x in BASE]}}

    launches = [{**launch("scan"), "device_ms": 0.25}, launch("dx"), launch("db")]
    extra = {"default": {"launches": launches, "hang_after": 2}}
    messages = []
    outcome = run_autotune(options(tmp_path, kernels=["ssd_combined_fwd_bwd"], shapes=["smoke"], extra=extra,
                                   job_timeout_seconds=3, max_attempts=1), messages.append)
    (entry,) = outcome.entries
    assert (entry["status"], entry["reason"]) == ("failed", "timeout")
    assert [launch["kernel"] for launch in entry["launches"]] == ["scan", "dx"]
    assert all(launch["decision"]["keep"] for launch in entry["launches"])
    assert set(config_store.load(outcome.out).kernels) == {"scan", "dx"}
    assert any("FAILED (timeout)" in m and "finished before: scan[shape=smoke] (0.250 ms per call) kept" in m
               and "dx[shape=smoke] kept" in m for m in messages)
    # The retry (a rerun here: one attempt per run above) tunes only the launch the kill cut off.
    extra = {"default": {"launches": launches, "hang_after": 5}}
    again = run_autotune(options(tmp_path, kernels=["ssd_combined_fwd_bwd"], shapes=["smoke"], extra=extra,
                                 job_timeout_seconds=3), quiet)
    assert again.complete
    assert [launch["kernel"] for launch in again.entries[-1]["launches"]] == ["db"]
    assert sorted(again.entries[-1]["tuned_elsewhere"]) == [["dx", "shape=smoke"], ["scan", "shape=smoke"]]
    assert set(config_store.load(again.out).kernels) == {"scan", "dx", "db"}
    assert again.summary["kept"] == 3


def test_a_job_is_measured_against_what_the_runtime_serves_it_the_winners_of_the_jobs_before_it_included(tmp_path):
    # A whole call's jobs at two shapes: the second job's launches have no config of their own, and the
    # runtime serves them the first job's winners as the nearest keys. Measured against the run's base (an
    # empty file on a new GPU), they were held to Helion's default, and the search was not seeded from them.
    committed = {"block_sizes": [8], "num_warps": 2}
    out = tmp_path / "configs" / "fake.yaml"
    config_store.save(out, config_store.ConfigFile(kernels={"other_k": {"shape=x": committed}}))
    outcome = run_autotune(options(tmp_path, kernels=["ssd_combined_fwd_bwd"], shapes=SHAPES, out=out), quiet)
    assert outcome.complete
    served = {e["job"]: config_store.load(outcome.run_dir / "jobs" / f"{e['job']}.served.yaml").kernels
              for e in outcome.entries}
    first, second = (f"ssd_combined_fwd_bwd@{shape}" for shape in SHAPES)
    assert served[first] == {"other_k": {"shape=x": committed}}
    assert served[second] == {"other_k": {"shape=x": committed},
                              "ssd_combined_fwd_bwd_k": {"shape=smoke": outcome.entries[0]["launches"][0]["config"]}}
    spec = json.loads((outcome.run_dir / "jobs" / f"{second}.spec.json").read_text())
    assert spec["base_configs"] == str(outcome.run_dir / "jobs" / f"{second}.served.yaml")


def test_a_kernel_whose_search_crashed_starts_isolated_in_later_runs_of_that_gpu(tmp_path):
    # The same seeded search meets the same faulting candidate again: on the H200 a new run (after a change
    # of kernel sources) crashed at chunk_scan once more and lost an attempt. Later runs of the GPU isolate
    # that kernel's searches from their first attempt; a hang, which a timeout also names, is no fault.
    launches = [{**fake_tuner.default_launch({"kernel": "chunk_state", "shape": "smoke", "index": i}),
                 "kernel": kernel} for i, kernel in enumerate(("dx_k", "scan_k"))]
    crash = {"jobs": {"chunk_state@smoke": {"crash_in_process": 1, "launches": launches}}}
    first = run_autotune(options(tmp_path, kernels=["chunk_state"], shapes=["smoke"], extra=crash), quiet)
    assert [e["status"] for e in first.entries] == ["failed", "ok"]
    # A new run (another plan) with the same faulting search: isolated at once, so no attempt is lost.
    again = {"default": {"crash_in_process": 1, "launches": launches}}
    later = run_autotune(options(tmp_path, kernels=["chunk_cumsum"], shapes=["smoke"], extra=again), quiet)
    assert later.run_dir != first.run_dir and [e["status"] for e in later.entries] == ["ok"]
    spec = json.loads((later.run_dir / "jobs" / "chunk_cumsum@smoke.spec.json").read_text())
    assert spec["isolate_kernels"] == ["scan_k"] and spec["helion_benchmark_subprocess"] is False
    hung = {"job": "j", "status": "failed", "reason": "timeout", "in_flight": ["dx_k", "k"]}
    assert tuneplan.faulted_kernels([hung, *first.entries]) == {"scan_k"}


def test_launches_that_would_outlast_the_timeout_are_left_to_the_next_attempt_which_runs_at_once(tmp_path):
    # A whole call's 14 launches at the search's floor outlasted its job's timeout on the H200: the attempt
    # was killed with a launch in flight. The tuner now stops before such a launch and names the rest; the
    # job stays pending, its next attempt runs at once and searches only those, and deferring attempts do
    # not use up the failed attempts a crash may still need.
    launches = [{**fake_tuner.default_launch({"kernel": "whole", "shape": "smoke", "index": i}), "kernel": k}
                for i, k in enumerate(("dx", "scan", "db"))]
    extra = {"default": {"launches": launches, "defer_after": 1}}
    messages: list[str] = []
    finished: list[str] = []
    outcome = run_autotune(options(tmp_path, kernels=["ssd_combined_fwd_bwd"], shapes=["smoke"], extra=extra,
                                   job_timeout_seconds=60, max_attempts=1), messages.append,
                           on_job=lambda entry: finished.append(entry["job"]))
    assert [(e["status"], [x["kernel"] for x in e["launches"]], e.get("deferred")) for e in outcome.entries] == [
        ("ok", ["dx"], [["scan", "shape=smoke"], ["db", "shape=smoke"]]),
        ("ok", ["scan"], [["db", "shape=smoke"]]), ("ok", ["db"], None)]
    assert outcome.complete and finished == ["ssd_combined_fwd_bwd@smoke"]
    assert set(config_store.load(outcome.out).kernels) == {"dx", "scan", "db"}
    assert sum("resuming its deferred launches" in m for m in messages) == 2
    assert any("2 launch(es) left to the next attempt" in m for m in messages)
    spec = json.loads((outcome.run_dir / "jobs" / "ssd_combined_fwd_bwd@smoke.spec.json").read_text())
    assert spec["timeout_seconds"] == 60
    deferring = {"job": "j@s", "status": "ok", "launches": [{"kernel": "dx"}], "deferred": [["db", "k"]]}
    jobs = [tuneplan.Job(0, "j", "s")]
    assert tuneplan.pending(jobs, [deferring], max_attempts=1) == jobs
    assert tuneplan.pending(jobs, [deferring, {"job": "j@s", "status": "failed", "reason": "crash"}], 2) == jobs
    assert tuneplan.retry_now("j@s", [deferring, {"job": "j@s", "status": "failed", "reason": "crash"}], 2)
    # An attempt that searched nothing cannot defer: the job would never end.
    assert tuneplan.pending(jobs, [{**deferring, "launches": []}], max_attempts=1) == []


def test_launches_that_would_end_past_the_runs_budget_are_deferred_to_its_next_attempt(tmp_path):
    # A night's job started on the time its kernel's jobs took, then ran on past the night's budget to its own
    # timeout. Its tuner now also stops before a launch that would end past the budget left as it started,
    # and the next attempt, expected to take only the launches left, resumes them while they fit.
    launches = [{**fake_tuner.default_launch({"kernel": "whole", "shape": "smoke", "index": i}), "kernel": k,
                 "tune_seconds": 40.0} for i, k in enumerate(("dx", "scan", "db"))]
    outcome = run_autotune(options(tmp_path, kernels=["ssd_combined_fwd_bwd"], shapes=["smoke"],
                                   extra={"default": {"launches": launches}}, job_timeout_seconds=1000,
                                   total_budget_seconds=100), quiet)
    # 40 s searched, then 40 + 40 + the launch's checks would pass the 100 s left: one launch per attempt
    assert [([x["kernel"] for x in e["launches"]], e.get("deferred")) for e in outcome.entries] == [
        (["dx"], [["scan", "shape=smoke"], ["db", "shape=smoke"]]), (["scan"], [["db", "shape=smoke"]]), (["db"], None)]
    spec = json.loads((outcome.run_dir / "jobs" / "ssd_combined_fwd_bwd@smoke.spec.json").read_text())
    assert spec["timeout_seconds"] == 1000 and 90 < spec["seconds_left"] < 100


def test_crash_and_hang_are_recorded_as_failed_and_the_run_continues(tmp_path):
    extra = {"jobs": {"chunk_state@smoke": {"crash": True}, "state_passing@smoke": {"hang": True}}}
    t0 = time.monotonic()
    outcome = run_autotune(options(tmp_path, extra=extra, job_timeout_seconds=3, max_attempts=1), quiet)
    assert time.monotonic() - t0 < 30
    by_job = {e["job"]: e for e in outcome.entries}
    assert by_job["chunk_state@smoke"]["status"] == "failed" and by_job["chunk_state@smoke"]["reason"] == "crash"
    assert "SIGSEGV" in by_job["chunk_state@smoke"]["detail"]
    assert by_job["state_passing@smoke"]["status"] == "failed"
    assert by_job["state_passing@smoke"]["reason"] == "timeout"
    assert outcome.summary["ok"] == 4 and outcome.summary["failed"] == 2
    cf = config_store.load(outcome.out)
    assert set(cf.kernels) == {"chunk_cumsum_k", "chunk_state_k", "state_passing_k"}
    assert "shape=smoke" not in cf.kernels["chunk_state_k"]
    # An incomplete run keeps a fingerprint only where the file had none: here it had none.
    assert cf.fingerprint == {"helion": "9.9"} and cf.tuned["jobs_failed"] == 2
    # A rerun retries the failed jobs (up to max_attempts), not the finished ones.
    calls = tmp_path / "calls"
    os.environ["FAKE_TUNE_CALLS"] = str(calls)
    try:
        again = run_autotune(options(tmp_path), quiet)  # no crash/hang this time (extra is not in the plan id)
    finally:
        del os.environ["FAKE_TUNE_CALLS"]
    assert sorted(line.split()[0] for line in calls.read_text().splitlines()) == [
        "chunk_state@smoke", "state_passing@smoke"]
    assert again.complete and again.summary["failed"] == 0
    # The retries benchmark Helion's candidates in its own subprocess: a faulting candidate would end an
    # in-process search again.
    isolated = {job: json.loads((again.run_dir / "jobs" / f"{job}.spec.json").read_text())
                ["helion_benchmark_subprocess"] for job in ("chunk_state@smoke", "state_passing@smoke",
                                                            "chunk_cumsum@smoke")}
    assert isolated == {"chunk_state@smoke": True, "state_passing@smoke": True, "chunk_cumsum@smoke": False}


def test_a_job_that_crashed_is_retried_at_once_with_only_the_launch_in_flight_isolated(tmp_path):
    # chunk_scan at long-context on the H200 and the H100: a candidate hit an illegal address and took the
    # job's child down. The retry isolates that launch's benchmarks in Helion's subprocess and searches the
    # rest in process: isolating them all cost each launch's search the subprocess's start.
    launches = [{**fake_tuner.default_launch({"kernel": "chunk_state", "shape": "smoke", "index": i}),
                 "kernel": kernel} for i, kernel in enumerate(("dx_k", "scan_k", "db_k"))]
    extra = {"jobs": {"chunk_state@smoke": {"crash_in_process": 1, "launches": launches},
                      "state_passing@smoke": {"crash": True}}}
    messages: list[str] = []
    finished: list[str] = []
    outcome = run_autotune(options(tmp_path, shapes=SHAPES[:1], extra=extra), messages.append,
                           on_job=lambda entry: finished.append(entry["job"]))
    attempts = [(e["job"], e["status"]) for e in outcome.entries]
    assert attempts == [("chunk_cumsum@smoke", "ok"), ("chunk_state@smoke", "failed"), ("chunk_state@smoke", "ok"),
                        ("state_passing@smoke", "failed"), ("state_passing@smoke", "failed")]  # max_attempts 2
    assert outcome.entries[1]["in_flight"] == ["scan_k", "shape=smoke"]
    assert [launch["kernel"] for launch in outcome.entries[1]["launches"]] == ["dx_k"]  # kept, not searched again
    assert finished == ["chunk_cumsum@smoke", "chunk_state@smoke", "state_passing@smoke"]  # one bar step a job
    assert sum("retrying" in m for m in messages) == 2
    retry = json.loads((outcome.run_dir / "jobs" / "chunk_state@smoke.spec.json").read_text())
    assert (retry["helion_benchmark_subprocess"], retry["isolate_launches"]) == (False, [["scan_k", "shape=smoke"]])
    assert ["dx_k", "shape=smoke"] in retry["tuned_elsewhere"]
    assert {"dx_k", "scan_k", "db_k"} <= set(config_store.load(outcome.out).kernels)
    # A crash that named no launch in flight (SIGSEGV before any search) isolates every launch of the retry.
    crashed = json.loads((outcome.run_dir / "jobs" / "state_passing@smoke.spec.json").read_text())
    assert (crashed["helion_benchmark_subprocess"], crashed["isolate_launches"]) == (True, [])
    assert outcome.summary["ok"] == 2 and outcome.summary["failed"] == 1
    assert tuneplan.retry_now("j", [{"job": "j", "status": "failed", "reason": "timeout"}])
    assert not tuneplan.retry_now("j", [{"job": "j", "status": "failed"}, {"job": "j", "status": "ok"}])
    assert not tuneplan.retry_now("j", [{"job": "j", "status": "failed", "reason": "timeout"}], max_attempts=1)
    assert not tuneplan.retry_now("j", [])


def test_a_worker_keeps_one_process_until_a_job_crashes_or_hangs_it(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_TUNE_CALLS", str(calls))
    extra = {"jobs": {"chunk_state@smoke": {"crash": True}, "chunk_cumsum@mamba2-default": {"hang": True}}}
    outcome = run_autotune(options(tmp_path, extra=extra, job_timeout_seconds=3, max_attempts=1), quiet)
    pids = {line.split()[0]: int(line.split()[1]) for line in calls.read_text().splitlines()}
    assert list(pids) == [j.id for j in outcome.jobs]
    first, second, third = (pids["chunk_cumsum@smoke"], pids["chunk_state@smoke"]), \
        (pids["state_passing@smoke"], pids["chunk_cumsum@mamba2-default"]), \
        (pids["chunk_state@mamba2-default"], pids["state_passing@mamba2-default"])
    assert len(set(first)) == len(set(second)) == len(set(third)) == 1
    assert len({first[0], second[0], third[0]}) == 3  # a fresh child after the crash and after the hang
    by_job = {e["job"]: e for e in outcome.entries}
    assert [by_job[j]["process"]["job_number"] for j in pids if by_job[j]["status"] == "ok"] == [1, 1, 1, 2]
    assert {by_job[j]["status"] for j in ("chunk_state@smoke", "chunk_cumsum@mamba2-default")} == {"failed"}


def test_a_tuner_that_raises_fails_its_job_with_the_error_and_the_next_job_gets_a_fresh_child(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_TUNE_CALLS", str(calls))
    extra = {"jobs": {"chunk_state@smoke": {"raise": "CUDA error: an illegal memory access"}}}
    outcome = run_autotune(options(tmp_path, kernels=KERNELS, shapes=SHAPES[:1], extra=extra, max_attempts=1), quiet)
    by_job = {e["job"]: e for e in outcome.entries}
    failed = by_job["chunk_state@smoke"]
    assert failed["status"] == "failed" and failed["reason"] == "crash"
    assert "illegal memory access" in failed["detail"] and "exit code 1" in failed["detail"]
    pids = {line.split()[0]: line.split()[1] for line in calls.read_text().splitlines()}
    assert pids["chunk_cumsum@smoke"] == pids["chunk_state@smoke"] != pids["state_passing@smoke"]
    assert by_job["state_passing@smoke"]["status"] == "ok"


def test_never_ship_a_slower_config(tmp_path):
    out = tmp_path / "configs" / "fake.yaml"
    committed = {"num_warps": 4}
    base = config_store.ConfigFile(fingerprint={"helion": "1.0"}, tuned={}, kernels={
        "k": {f"case={n}": dict(committed) for n in ("slower", "faster", "marginal", "imprecise", "same")}})
    config_store.save(out, base)

    def job(case, factor, ok=True, config=None):
        return {"launches": [{"kernel": "k", "key": f"case={case}", "config": config or {"num_warps": 8},
                              "incumbent": "committed", "incumbent_config": committed, "precision": {"ok": ok},
                              "samples_ms": {"incumbent": BASE, "candidate": [x * factor for x in BASE]}}]}

    extra = {"jobs": {"chunk_cumsum@smoke": job("slower", 1.08), "chunk_state@smoke": job("faster", 0.9),
                      "state_passing@smoke": job("marginal", 0.995),
                      "chunk_cumsum@mamba2-default": job("imprecise", 0.5, ok=False),
                      "chunk_state@mamba2-default": job("same", 0.9, config=committed),
                      "state_passing@mamba2-default": {"launches": []}}}
    outcome = run_autotune(options(tmp_path, extra=extra), quiet)
    cf = config_store.load(out)
    assert cf.kernels["k"]["case=faster"] == {"num_warps": 8}
    for case in ("slower", "marginal", "imprecise", "same"):
        assert cf.kernels["k"][f"case={case}"] == committed, case
    assert outcome.changed and outcome.complete
    assert outcome.summary["kept"] == 1 and outcome.summary["rejected"] == 4
    reasons = {lc["key"]: lc["decision"]["reason"] for e in outcome.entries for lc in e.get("launches", [])}
    assert "precision" in reasons["case=imprecise"] and "margin" in reasons["case=marginal"]
    assert cf.fingerprint == {"helion": "9.9"}  # complete: the configs now carry the new environment


@pytest.mark.parametrize("workers", [2, 5])
def test_sharded_run_equals_sequential(tmp_path, workers):
    seq = run_autotune(options(tmp_path / "seq"), quiet)
    par = run_autotune(options(tmp_path / "par", devices=tuple(str(i) for i in range(workers))), quiet)
    assert config_store.load(seq.out).kernels == config_store.load(par.out).kernels
    assert {e["job"]: [lc["decision"] for lc in e["launches"]] for e in seq.entries} == {
        e["job"]: [lc["decision"] for lc in e["launches"]] for e in par.entries}
    for e in par.entries:  # one worker per GPU, by the static assignment, each job naming its card
        assert e["worker"] == e["index"] % workers and e["device"] == str(e["worker"])
        assert e["gpu"]["uuid"] == f"GPU-fake-{e['device']}"


def _journal(state: Path) -> list[dict]:
    found = list(state.glob("autotune/*/journal.jsonl"))
    return tuneplan.parse_journal(found[0].read_text()) if found else []


def test_resume_after_kill_9(tmp_path):
    state, out, calls = tmp_path / "state", tmp_path / "configs" / "fake.yaml", tmp_path / "calls"
    cmd = [sys.executable, "-m", "mamba2_guard", "autotune", "--tuner", FAKE, "--kernels", *KERNELS,
           "--shapes", *SHAPES, "--state-dir", str(state), "--out", str(out), "--gpu-slug", "fake",
           "--budget-seconds", "5", "--workers", "1"]
    env = dict(os.environ, FAKE_TUNE_CALLS=str(calls), FAKE_TUNE_EXTRA=json.dumps({"default": {"sleep": 0.6}}))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    reads = 0
    try:
        while len(_journal(state)) < 2:
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline
            if out.exists():  # every observed version of the file is complete
                config_store.load(out)
                reads += 1
            time.sleep(0.05)
        time.sleep(0.3)  # the third job is in flight
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    finished = {e["job"] for e in _journal(state)}
    assert 2 <= len(finished) < 6
    cf = config_store.load(out)
    # The file is rewritten right after each journal line: a kill between the two leaves it one job
    # behind the journal (the resume brings it in step first), never ahead and never torn.
    assert len(finished) - 1 <= sum(len(v) for v in cf.kernels.values()) <= len(finished)
    # The orphaned child kills itself when its parent is gone.
    pids = [int(line.split()[1]) for line in calls.read_text().splitlines()]
    time.sleep(1.0)
    for pid in pids:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text() or "State:\tZ" in status.read_text()

    env["FAKE_TUNE_EXTRA"] = json.dumps({"default": {"sleep": 0}})
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6/6 jobs ok" in done.stdout
    called = [line.split()[0] for line in calls.read_text().splitlines()]
    for job in finished:
        assert called.count(job) == 1, (job, called)  # finished jobs are never redone
    assert sorted(set(called)) == sorted(f"{k}@{s}" for k in KERNELS for s in SHAPES)
    cf = config_store.load(out)
    assert sum(len(v) for v in cf.kernels.values()) == 6
    assert not list(out.parent.glob(".*.tmp"))
    logs = [p for p in state.glob("autotune/*/logs/*.log") if not p.name.startswith("worker-")]
    assert sorted(p.stem for p in logs) == sorted(f"{k}@{s}" for k in KERNELS for s in SHAPES)
    for log in logs:  # each job's output in its own log (the job killed in flight ran twice), none other's
        lines = log.read_text().splitlines()
        assert lines and set(lines) == {f"fake tuner: {log.stem}"}, (log, lines)


def test_overall_budget_starts_no_job_it_cannot_hold_and_cuts_none_short(tmp_path):
    # Each job sleeps 1.5 s with a 1 s tuning budget, inside a 2 s overall budget: the first job starts
    # (2 s left >= 1 s) and the second (0.5 s left < 1 s) does not. The first job outlives the overall
    # budget and still finishes: it is never killed at the deadline.
    extra = {"default": {"sleep": 1.5}}
    outcome = run_autotune(options(tmp_path, kernels=KERNELS[:1], extra=extra, budget_seconds=1,
                                   total_budget_seconds=2.0, job_timeout_seconds=20), quiet)
    assert [e["job"] for e in outcome.entries] == ["chunk_cumsum@smoke"]
    assert outcome.entries[0]["status"] == "ok"
    assert outcome.skipped == ["chunk_cumsum@mamba2-default"] and not outcome.complete


def test_a_job_starts_only_while_the_time_its_kernels_jobs_took_still_fits(tmp_path):
    # Each job sleeps 2.5 s with a 1 s tuning budget, inside a 4 s overall budget: the first starts (no job time
    # known yet: its budget fits), the second does not, though 1.5 s left holds its budget: a job of its kernel
    # just took 2.5 s. Started, it would run past the overall budget (a hard limit would kill it).
    extra = {"default": {"sleep": 2.5}}
    outcome = run_autotune(options(tmp_path, kernels=KERNELS[:1], extra=extra, budget_seconds=1,
                                   total_budget_seconds=4.0, job_timeout_seconds=20), quiet)
    assert [e["job"] for e in outcome.entries] == ["chunk_cumsum@smoke"]
    assert outcome.skipped == ["chunk_cumsum@mamba2-default"]


def test_a_later_job_leaves_a_minor_launch_to_the_config_an_earlier_job_searched_nearby(tmp_path):
    # Two whole calls at two sizes: the second's small launch (under 5 % of its time) has a key of the same code
    # as the first's, which searched it; it is not searched again. Its big launch and a small launch of another
    # code (another chunk size) are.
    def launch(kernel, key, ms):
        return {"kernel": kernel, "key": key, "device_ms": ms, "config": {"block_sizes": [32], "num_warps": 4},
                "incumbent": "default", "incumbent_config": {"block_sizes": [16], "num_warps": 2},
                "precision": {"ok": True}, "samples_ms": {"incumbent": BASE, "candidate": [0.9 * x for x in BASE]}}

    extra = {"jobs": {
        "chunk_cumsum@smoke": {"launches": [launch("big_k", "chunk_size=64,tokens=8192", 1.0),
                                            launch("cumsum_k", "chunk_size=64,tokens=8192", 0.01)]},
        "chunk_state@smoke": {"launches": [launch("big_k", "chunk_size=64,tokens=16384", 2.0),
                                           launch("cumsum_k", "chunk_size=64,tokens=16384", 0.02),
                                           launch("cumsum_k", "chunk_size=128,tokens=16384", 0.02)]}}}
    outcome = run_autotune(options(tmp_path, kernels=KERNELS[:2], shapes=SHAPES[:1], extra=extra), quiet)
    first, second = outcome.entries
    assert [lc["kernel"] for lc in first["launches"]] == ["big_k", "cumsum_k"] and "minor" not in first
    assert [(lc["kernel"], lc["key"]) for lc in second["launches"]] == [("big_k", "chunk_size=64,tokens=16384"),
                                                                       ("cumsum_k", "chunk_size=128,tokens=16384")]
    assert second["minor"] == [["cumsum_k", "chunk_size=64,tokens=16384"]]
    assert "1 minor launch(es) left to the configs of nearby keys" in autotune.describe(second)


def test_a_later_job_skips_launches_an_earlier_job_tuned(tmp_path):
    # Like a whole call after the per-kernel jobs: job 2 launches the Helion kernel job 1 already tuned.
    shared = {"kernel": "shared_k", "key": "shape=smoke", "config": {"block_sizes": [32], "num_warps": 4},
              "incumbent": "default", "incumbent_config": {"block_sizes": [16], "num_warps": 2},
              "precision": {"ok": True}, "samples_ms": {"incumbent": BASE, "candidate": [0.9 * x for x in BASE]}}
    own = {**shared, "kernel": "own_k"}
    extra = {"jobs": {"chunk_cumsum@smoke": {"launches": [shared]},
                      "chunk_state@smoke": {"launches": [shared, own]}}}
    outcome = run_autotune(options(tmp_path, kernels=KERNELS[:2], shapes=SHAPES[:1], extra=extra), quiet)
    first, second = outcome.entries
    assert [lc["kernel"] for lc in first["launches"]] == ["shared_k"] and first["tuned_elsewhere"] == []
    assert [lc["kernel"] for lc in second["launches"]] == ["own_k"]
    assert second["tuned_elsewhere"] == [["shared_k", "shape=smoke"]]
    assert set(config_store.load(outcome.out).kernels) == {"shared_k", "own_k"}


def test_a_new_run_does_not_search_again_what_a_run_of_the_same_kernels_and_settings_searched(tmp_path):
    # A guard upgrade that changed only host code (the selection rule's weights), with a new order of the
    # bring-up's jobs, gave the H100's bring-up a new run, which would have searched its three finished jobs
    # again from their winners: 25 device-minutes for nothing. A change of a kernel's source, or of the search
    # settings, still searches again.
    sources = {"ssd/chunk_scan.py": "1" * 64, "config_store.py": "2" * 64}
    fp = {"helion": "9.9", "kernel_sources": sources}
    first = run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1], fingerprint=fp), quiet)
    winner = config_store.load(first.out).kernels["chunk_cumsum_k"]["shape=smoke"]

    def later(fingerprint, **kw):
        outcome = run_autotune(options(tmp_path, shapes=SHAPES[:1], fingerprint=fingerprint,
                                       fingerprint_digest="e" * 64, **kw), quiet)
        assert outcome.run_dir != first.run_dir
        return {e["job"]: e for e in outcome.entries}["chunk_cumsum@smoke"], outcome

    host = {**fp, "kernel_sources": {**sources, "config_store.py": "3" * 64}}
    # A budget below a search's: the finished job only records its call, so it still starts; the others do not.
    entry, outcome = later(host, kernels=KERNELS[::-1], total_budget_seconds=3)
    assert entry["launches"] == [] and entry["tuned_elsewhere"] == [["chunk_cumsum_k", "shape=smoke"]]
    assert config_store.load(outcome.out).kernels["chunk_cumsum_k"]["shape=smoke"] == winner
    assert outcome.skipped == ["state_passing@smoke", "chunk_state@smoke"]
    # --fresh starts a run over: nothing is carried into it.
    entry, outcome = later(host, kernels=KERNELS[::-1], fresh=True)
    assert [lc["kernel"] for lc in entry["launches"]] == ["chunk_cumsum_k"] and not entry["tuned_elsewhere"]
    kernel = {**fp, "kernel_sources": {**sources, "ssd/chunk_scan.py": "4" * 64}}
    assert [lc["kernel"] for lc in later(kernel, kernels=KERNELS[:2])[0]["launches"]] == ["chunk_cumsum_k"]
    assert [lc["kernel"] for lc in later(host, kernels=KERNELS[:2], budget_seconds=7)[0]["launches"]] \
        == ["chunk_cumsum_k"]


def test_a_run_from_before_runs_recorded_their_environment_is_known_by_the_file_it_stamped(tmp_path):
    # The H100's bring-up state began before runs wrote fingerprint.json. Its first run stamped the config
    # file, which was empty, with its fingerprint: that record is the run's environment when it hashes to the
    # plan's digest; one that does not is no evidence, and the launches are searched again.
    from mamba2_guard.core.fingerprint_hash import fingerprint_hash

    fp = {"helion": "9.9", "kernel_sources": {"ssd/chunk_scan.py": "1" * 64}}
    first = run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1], fingerprint=fp,
                                 fingerprint_digest=fingerprint_hash(fp)), quiet)
    (first.run_dir / "fingerprint.json").unlink()
    again = run_autotune(options(tmp_path, kernels=KERNELS[:2], shapes=SHAPES[:1], fingerprint=fp,
                                 fingerprint_digest=fingerprint_hash(fp)), quiet)
    assert again.entries[0]["tuned_elsewhere"] == [["chunk_cumsum_k", "shape=smoke"]]
    plan = json.loads((first.run_dir / "plan.json").read_text())
    assert autotune.run_fingerprint(first.run_dir, plan) == fp
    assert autotune.run_fingerprint(first.run_dir, {**plan, "fingerprint_digest": "f" * 64}) is None
    # A run that --fresh set aside is no evidence either: its directory is no longer the one its plan names.
    first.run_dir.rename(first.run_dir.with_name(first.run_dir.name + "-old-20261206T000000"))
    third = run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1], fingerprint=fp,
                                 fingerprint_digest=fingerprint_hash(fp)), quiet)
    assert [launch["kernel"] for launch in third.entries[0]["launches"]] == ["chunk_cumsum_k"]


def test_config_file_keeps_the_provenance_of_earlier_runs(tmp_path):
    first = run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1]), quiet)
    first_run = config_store.load(first.out).tuned["run"]
    second = run_autotune(options(tmp_path, kernels=KERNELS[1:2], shapes=SHAPES[:1]), quiet)
    tuned = config_store.load(second.out).tuned
    assert tuned["run"] != first_run
    assert [(r["run"], r["jobs"]) for r in tuned["earlier"]] == [(first_run, 1)]
    assert "earlier" not in tuned["earlier"][0]  # one flat list, not nested records
    assert set(config_store.load(second.out).kernels) == {"chunk_cumsum_k", "chunk_state_k"}


def test_a_re_tune_keeps_the_fitted_selection_and_chain_rules(tmp_path):
    out = tmp_path / "configs" / "fake.yaml"
    rules = {"chunk_scan": {"flag": 1.5, "size": 0.25, "tile": 3.0, "fitted_on": 8},
             "chunk_state_passing": {"chain": {"min_chunk": 256, "max_state": 828972, "fitted_on": 8}}}
    config_store.save(out, config_store.ConfigFile(selection=rules))
    run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1]), quiet)
    written = config_store.load(out)
    assert written.kernels  # the run wrote its configs
    assert written.selection == rules
    assert written.chain_rule("chunk_state_passing") == config_store.ChainRule(256, 828972)


def test_a_rerun_keeps_what_reached_the_file_since_the_run_began(tmp_path):
    """A run's winners go over the config file as it is at each save, not over the run's base: a rerun of a
    finished plan (the same run id: it resumes) keeps another run's winners and a rule fitted in between."""
    out = tmp_path / "configs" / "fake.yaml"
    first = run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1]), quiet)
    other = run_autotune(options(tmp_path, kernels=KERNELS[1:2], shapes=SHAPES[:1]), quiet)
    rules = {"chunk_scan": {"flag": 1.5, "size": 0.25, "tile": 3.0, "fitted_on": 8}}
    fitted = config_store.load(out)
    config_store.save(out, config_store.ConfigFile(fitted.fingerprint, fitted.tuned, fitted.kernels, rules))
    again = run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1]), quiet)
    assert again.run_dir == first.run_dir and len(again.entries) == 1  # resumed, nothing run again
    written = config_store.load(out)
    assert set(written.kernels) == {"chunk_cumsum_k", "chunk_state_k"} and written.selection == rules
    # the provenance: the other run before this one, not this run's own earlier save
    assert written.tuned["run"] == first.run_dir.name.split("-")[-1]
    assert [r["run"] for r in written.tuned["earlier"]] == [other.run_dir.name.split("-")[-1]]


def test_one_autotune_at_a_time_per_state_directory(tmp_path):
    """A second run beside a running one (a CLI run during the nightly's re-tune) would time its candidates on
    a busy GPU and write the config file in turns: it is refused, exit 2 naming the lock; after the first, it
    runs."""
    state, out = tmp_path / "state", tmp_path / "configs" / "fake.yaml"
    cmd = [sys.executable, "-m", "mamba2_guard", "autotune", "--tuner", FAKE, "--shapes", "smoke",
           "--state-dir", str(state), "--out", str(out), "--gpu-slug", "fake", "--budget-seconds", "5",
           "--workers", "1", "--kernels"]
    release = tmp_path / "release"  # the first run's job answers once it exists, however slow the machine
    env = dict(os.environ, FAKE_TUNE_EXTRA=json.dumps({"jobs": {"chunk_cumsum@smoke": {"until": str(release)}}}))
    first = subprocess.Popen([*cmd, "chunk_cumsum"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(state.glob("autotune/*/logs/worker-0.log")):  # the first run holds the lock
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        second = subprocess.run([*cmd, "chunk_state"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stderr.strip() == f"mamba2-guard: another autotune run holds {state / 'autotune.lock'}"
        release.touch()
        assert first.wait(120) == 0
    finally:
        if first.poll() is None:
            first.kill()
    third = subprocess.run([*cmd, "chunk_state"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stdout + third.stderr
    assert set(config_store.load(out).kernels) == {"chunk_cumsum_k", "chunk_state_k"}


# A fit whose save waits until another writer changed the config file after the fit read it (or 5 s pass).
LATE_FIT = """
import sys, time
from pathlib import Path
from mamba2_kernels import config_store
from mamba2_guard.flows import selection_measure
out, measurements, read = map(Path, sys.argv[1:4])
save = config_store.save
def save_late(path, cf):
    read.touch()
    before, deadline = out.read_bytes(), time.monotonic() + 5
    while out.read_bytes() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    save(path, cf)
config_store.save = save_late
selection_measure.fit_into(out, measurements)
"""


def test_a_save_waits_for_another_writer_between_its_read_and_its_save(tmp_path):
    """Autotune runs of two state directories, or a run and a fit, write one config file, each its change
    over the file as it read it: a save while another writer is between its read and its save would be
    overwritten by that writer's. The save waits for it, and both changes stay."""
    out = tmp_path / "configs" / "fake.yaml"
    config_store.save(out, config_store.ConfigFile())
    measurements, read = tmp_path / "m.jsonl", tmp_path / "fit-read"
    key = "dstate=64,tokens=8192"
    measurements.write_text(json.dumps({"shape": "s", "kernel": "chunk_scan", "key": key, "ms": {key: 0.5},
                                        "errors": {}, "configs": {key: {"num_warps": 4}}, "aliases": {}}) + "\n")
    fit = subprocess.Popen([sys.executable, "-c", LATE_FIT, str(out), str(measurements), str(read)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not read.exists():
            assert fit.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1]), quiet)
        assert fit.wait(timeout=60) == 0
    finally:
        fit.kill()
    written = config_store.load(out)
    assert "chunk_cumsum_k" in written.kernels  # the run's winner
    assert written.kernels["chunk_scan"] == {key: {"num_warps": 4}}  # the fit's winner and rule
    assert written.selection["chunk_scan"]["fitted_on"] == 1


def test_candidates_are_timed_through_the_public_function_with_their_config_pinned(monkeypatch):
    """The worker times the registry entry's public function (host-side sums of partials included), with
    the candidate pinned for its own shape key only, and leaves the kernel's normal lookup afterwards."""
    import torch

    from mamba2_guard.flows.autotune_worker import _entry_on
    from mamba2_kernels import registry, suites
    from mamba2_kernels.testing import execution_mode
    from mamba2_kernels.tuning import capture_launches

    entry = registry.get("causal_conv1d_bwd")
    inputs = entry.inputs(suites.load().shape("smoke"), 0, torch.device("cpu"))
    with capture_launches() as launches, execution_mode("ref"):
        entry.run_helion(inputs)
    kernel, args = launches[0]
    candidate = {"block_sizes": [16, 4], "num_warps": 2}
    built = []
    real = kernel.helion_kernel
    monkeypatch.setattr(kernel, "helion_kernel", lambda config, mode="compiled", *layout, **kw: (
        built.append(config), real(config, mode, *layout, **kw))[1])
    call = _entry_on(entry, inputs, kernel, candidate, kernel.shape_key(*args), {})
    with capture_launches() as timed, execution_mode("ref"):
        call()
    assert [k.name for k, _ in timed] == ["causal_conv1d_bwd"]  # the whole public function ran
    assert built and all(config == candidate for config in built)  # the candidate ran, and only it
    assert "candidates" not in vars(kernel)  # the pin is gone: the config store answers again


def test_a_job_with_other_paths_searches_the_chains_launches_and_checks_and_times_them_on_the_chain():
    """A GPU without a chain rule runs the state passes fused: a bring-up job also records the call with them
    forced to their chain, and searches the launches only that call makes, each on its own path."""
    import torch

    from mamba2_guard.flows.autotune_worker import _entry_on, captured_on_paths
    from mamba2_kernels import registry, suites
    from mamba2_kernels.testing import execution_mode
    from mamba2_kernels.tuning import capture_launches

    entry = registry.get("ssd_combined_fwd_bwd")
    inputs = entry.inputs(suites.load().shape("smoke"), 0, torch.device("cpu"))
    chains = {"chunk_state_passing": "chain", "chunk_state_passing_bwd": "chain"}
    with execution_mode("ref"):
        rules, rules_paths = captured_on_paths(entry, inputs, {})
        both, paths_of = captured_on_paths(entry, inputs, chains)
    names = {kernel.name for kernel, _ in rules}
    assert "chunk_state_passing" in names and not names & {"chunk_state", "state_passing"}
    assert all(paths == {} for paths in rules_paths.values())

    def slots(launches):
        return [(kernel.name, str(kernel.shape_key(*args))) for kernel, args in launches]

    assert slots(both[:len(rules)]) == slots(rules)  # the rules' launches first, each as often as the call makes it
    added = set(slots(both[len(rules):]))
    assert {name for name, _ in added} >= {"chunk_state", "state_passing", "chunk_scan_bwd_dstates",
                                           "state_passing_bwd"}
    assert all(paths_of[slot] == chains for slot in added) and not added & set(rules_paths)
    kernel, args = next((k, a) for k, a in both[len(rules):] if k.name == "chunk_state")
    call = _entry_on(entry, inputs, kernel, {"block_sizes": [16, 16, 16], "num_warps": 4}, kernel.shape_key(*args),
                     paths_of[kernel.name, str(kernel.shape_key(*args))])
    with capture_launches() as timed, execution_mode("ref"):
        call()
    assert "chunk_state" in {k.name for k, _ in timed}  # timed on the chain, where its config runs


def test_a_job_with_the_fused_path_searches_the_fused_kernels_launches_on_that_path():
    """A tuned GPU without fuse rules runs the fusions chained: its bring-up's jobs also record the call with
    them forced fused, and search the fused kernels' launches, which that call alone makes."""
    import torch

    from mamba2_guard.flows.autotune_worker import captured_on_paths
    from mamba2_guard.flows.bringup import ALSO_PATHS
    from mamba2_kernels import registry, suites
    from mamba2_kernels.testing import execution_mode

    entry = registry.get("ssd_combined_fwd_bwd")
    inputs = entry.inputs(suites.load().shape("smoke"), 0, torch.device("cpu"))
    with execution_mode("ref"):
        rules, _ = captured_on_paths(entry, inputs, {})
        both, paths_of = captured_on_paths(entry, inputs, ALSO_PATHS["fused"])
    added = {(kernel.name, str(kernel.shape_key(*args))) for kernel, args in both[len(rules):]}
    assert "chunk_bwd_db_dc" not in {kernel.name for kernel, _ in rules}
    # the forward after chunk_cumsum in one launch; in the backward the cumsum in the recompute's state pass, the
    # C B^T in the dCB stage, dB and dC in one pass
    assert {name for name, _ in added} == {"ssd_fused_fwd", "chunk_state_passing", "chunk_scan_bwd_dcb",
                                           "chunk_bwd_db_dc"}
    assert all(paths_of[slot] == ALSO_PATHS["fused"] for slot in added)


def test_the_paths_are_timed_on_the_configs_the_jobs_decisions_keep(monkeypatch):
    """After its searches a job times the state pass fused and chained: each searched launch on its winner
    where the decision keeps it, else on the incumbent the runtime goes on serving."""
    import torch

    from mamba2_guard.flows.autotune_worker import captured_on_paths, paths_on_winners
    from mamba2_kernels import registry, suites
    from mamba2_kernels.testing import execution_mode
    from tests.guard.flows.test_selection_measure import CallingTimer

    entry = registry.get("ssd_combined_fwd_bwd")
    inputs = entry.inputs(suites.load().shape("smoke"), 0, torch.device("cpu"))
    chains = {"chunk_state_passing": "chain", "chunk_state_passing_bwd": "chain"}
    with execution_mode("ref"):
        captured, _ = captured_on_paths(entry, inputs, chains)
    kernel, _, key = next((k, a, k.shape_key(*a)) for k, a in captured if k.name == "chunk_state")
    winner, incumbent = {"block_sizes": [16, 16, 16], "num_warps": 2}, {"block_sizes": [16, 16, 16], "num_warps": 8}
    built = []
    real = kernel.helion_kernel
    monkeypatch.setattr(kernel, "helion_kernel", lambda config, mode="compiled", *layout, **kw: (
        built.append(config), real(config, mode, *layout, **kw))[1])

    def timed(candidate_ms: float) -> list[dict]:
        built.clear()
        record = {"kernel": "chunk_state", "key": str(key), "config": winner, "incumbent": "default",
                  "incumbent_config": incumbent, "precision": {"ok": True},
                  "samples_ms": {"incumbent": BASE, "candidate": [candidate_ms * x for x in BASE]}}
        with execution_mode("ref"):
            return paths_on_winners("smoke", 0, 3, CallingTimer(), [(kernel, (), key)], [record],
                                    ["chunk_state_passing"], tuneplan.Criteria(), device="cpu")

    records = timed(0.8)
    assert [(r["stage"], sorted(r["ms"])) for r in records] == [("chunk_state_passing", ["chain", "fused"])]
    assert built and all(config == winner for config in built)  # kept: the chain ran on the winner
    timed(1.2)
    assert built and all(config == incumbent for config in built)  # rejected: on the incumbent


def test_a_jobs_line_says_when_its_paths_were_not_timed():
    """The timing of the two paths failing keeps the job's launches; the log says why no timing came."""
    entry = {"job": "ssd_combined_fwd_bwd@smoke", "seconds": 3.0, "status": tuneplan.OK, "launches": [],
             "paths_error": "RuntimeError: operation not permitted when stream is capturing"}
    assert autotune.describe(entry) == ("ssd_combined_fwd_bwd@smoke (3 s): the paths were not timed: "
                                        "RuntimeError: operation not permitted when stream is capturing")


def test_a_run_that_also_searches_other_paths_skips_what_a_run_without_them_searched(tmp_path):
    """Searching the other paths' launches too adds launches to a job, not another search of those it had: a
    bring-up resumed with them does not search its finished jobs' launches again. The tuner gets the paths."""
    first = run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1]), quiet)
    chains = {"chunk_state_passing": "chain"}
    again = run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1], also_paths=chains), quiet)
    assert again.run_dir != first.run_dir
    entry = {e["job"]: e for e in again.entries}["chunk_cumsum@smoke"]
    assert entry["launches"] == [] and entry["tuned_elsewhere"] == [["chunk_cumsum_k", "shape=smoke"]]
    spec = json.loads(next((again.run_dir / "jobs").glob("*.spec.json")).read_text())
    assert spec["also_paths"] == chains


def test_a_job_finished_without_the_other_paths_is_not_expected_to_take_its_set_up_alone(tmp_path):
    """A job that a run of the same search identity finished records its call in a new run, in its set-up's
    time; with other paths to search it has their launches still to search, so a night's last seconds do not
    start it: a hard limit would kill it mid-search."""
    extra = {"default": {"sleep": 1.0}}
    run_autotune(options(tmp_path, kernels=KERNELS[:1], shapes=SHAPES[:1], extra=extra, budget_seconds=1), quiet)
    chains = {"chunk_state_passing": "chain"}
    tight = {"kernels": KERNELS[:1], "shapes": SHAPES[:1], "extra": extra, "budget_seconds": 1,
             "total_budget_seconds": 0.5}
    with_paths = run_autotune(options(tmp_path, also_paths=chains, **tight), quiet)
    assert with_paths.entries == [] and with_paths.skipped == ["chunk_cumsum@smoke"]
    alike = run_autotune(options(tmp_path, fingerprint_digest="e" * 64, **tight), quiet)
    assert [e["job"] for e in alike.entries] == ["chunk_cumsum@smoke"] and not alike.skipped


def test_the_config_file_names_the_searches_that_failed(tmp_path):
    failed = {"kernel": "chunk_state_k", "key": "shape=smoke", "config": None, "incumbent": "default",
              "error": "NoConfigFound: No working config found from autotuning"}
    extra = {"jobs": {"chunk_state@smoke": {"launches": [failed]}}}
    first = run_autotune(options(tmp_path, extra=extra), quiet)
    tuned = config_store.load(first.out).tuned
    assert tuned["searches_failed"] == ["chunk_state_k[shape=smoke]: NoConfigFound"]
    # A new run of the same search settings and kernels (a host-only upgrade) searches that launch no more: the
    # failure still stands, and the list keeps it.
    carried = run_autotune(options(tmp_path, fingerprint_digest="e" * 64), quiet)
    assert carried.run_dir != first.run_dir
    assert config_store.load(carried.out).tuned["searches_failed"] == tuned["searches_failed"]
    # A later run that searches again records its own failures; the provenance of earlier runs does not carry
    # the list.
    second = run_autotune(options(tmp_path, budget_seconds=6), quiet)
    tuned = config_store.load(second.out).tuned
    assert tuned["searches_failed"] == [] and "searches_failed" not in tuned["earlier"][-1]


def test_the_incumbent_as_helions_reference_survives_its_settings_copy():
    """Helion deep-copies its settings before a search (and pickles them for subprocesses): a
    ``helion.Kernel`` there failed every warm-started search on the H200 (`cannot pickle RLock`)."""
    import copy
    import pickle

    import helion
    import torch

    from mamba2_guard.flows.autotune_worker import incumbent_run
    from mamba2_kernels import registry, suites
    from mamba2_kernels.testing import execution_mode
    from mamba2_kernels.tuning import capture_launches

    entry = registry.get("chunk_cumsum")
    inputs = entry.inputs(suites.load().shape("smoke"), 0, torch.device("cpu"))
    with capture_launches() as launches, execution_mode("triton"):
        entry.run_helion(inputs)
    kernel, args = launches[0]
    config = {"block_sizes": [2], "num_warps": 2}
    reference = incumbent_run(kernel, config)
    assert helion.Settings(autotune_baseline_fn=reference).to_dict()
    for copied in (copy.deepcopy(reference), pickle.loads(pickle.dumps(reference))):
        with execution_mode("triton"):
            got, want = copied(*args), kernel.helion_kernel(config, "compiled")(*args)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    with pytest.raises(ValueError, match="kernel: expected a tuned kernel importable"):
        incumbent_run(copy.copy(kernel), config)


@pytest.mark.parametrize("budget, compile_timeout", [(10, 5), (15, 7), (40, 20), (300, 60), (4, 5)])
def test_a_compile_may_take_half_the_search_budget(budget, compile_timeout):
    from mamba2_guard.flows.autotune_worker import search_settings

    settings = search_settings("quick", 7, budget, False)
    assert settings["autotune_compile_timeout"] == compile_timeout
    assert (settings["autotune_budget_seconds"], settings["autotune_random_seed"]) == (budget, 7)


def test_a_search_starts_from_the_config_file_not_from_this_machines_cache():
    """Helion's cached winners of other keys entered the population raw and crashed its surrogate; the search
    is seeded from the config file instead (the incumbent and the neighbours, adapted)."""
    import helion

    from mamba2_guard.flows.autotune_worker import search_settings

    settings = search_settings("quick", 7, 30, False)
    assert helion.Settings(**settings).autotune_best_available_max_configs == 0


@pytest.fixture
def cumsum_launch():
    """chunk_cumsum's launch in the smoke shape's SSD call: (kernel, args, key)."""
    import torch

    from mamba2_kernels import registry, suites
    from mamba2_kernels.tuning import capture_launches

    entry = registry.get("chunk_cumsum")
    inputs = entry.inputs(suites.load().shape("smoke"), 0, torch.device("cpu"))
    with capture_launches() as launches:
        entry.run_helion(inputs)
    kernel, args = launches[0]
    return kernel, args, kernel.shape_key(*args)


def test_the_configs_of_a_kernels_other_shapes_seed_its_search(cumsum_launch):
    """Long-context's chunk_scan on the H200: nemotron3-nano's new config, seeded, measured 1.27 ms against
    1.78 ms for the nearest config the job started from."""
    from mamba2_guard.flows.autotune_worker import neighbour_seeds
    from mamba2_kernels.config_store import ConfigFile, ShapeKey

    kernel, args, key = cumsum_launch
    fields = dict(key.fields)

    def like(**changes):
        return ShapeKey.of(**{**fields, **changes})

    far, near, other_dtype = like(tokens=fields["tokens"] * 64), like(tokens=fields["tokens"] * 2), like(dtype="x")
    base = ConfigFile(kernels={kernel.name: {
        str(key): {"block_sizes": [4]},  # its own: the incumbent, not a neighbour
        str(far): {"block_sizes": [1], "num_warps": 1},
        str(near): {"block_sizes": [2], "num_warps": 2},
        str(other_dtype): {"block_sizes": [4], "num_warps": 8},  # another flag: a related key, ranked by distance
        str(like(tokens=fields["tokens"] * 4)): {"block_sizes": [3]},  # not a power of 2: invalid
    }})
    seeds = neighbour_seeds(kernel, args, base, key)
    # nearest first: 2x the tokens (0.5), another dtype (1.0), 64x the tokens (3.0)
    assert [(s["block_sizes"], s["num_warps"]) for s in seeds] == [([2], 2), ([4], 8), ([1], 1)]
    assert neighbour_seeds(kernel, args, ConfigFile(), key) == []


def test_the_search_starts_from_the_incumbent_in_both_loop_orders(cumsum_launch):
    """chunk_scan and dx at chunk 256 on the H200: their stored configs, launched innermost tiles first,
    ran 3-9 % faster, an order the search had not kept in any stored config."""
    from mamba2_guard.flows.autotune_worker import search_seeds
    from mamba2_kernels.config_store import ConfigFile

    kernel, args, key = cumsum_launch
    incumbent = dict(kernel.bound(args).config_spec.default_config())
    dims = len(incumbent["loop_orders"][0])
    assert dims > 1
    seeds = search_seeds(kernel, args, ConfigFile(), key, incumbent)
    assert seeds[0] == incumbent
    assert seeds[1] == {**incumbent, "loop_orders": [list(range(dims))[::-1]]}
    assert len(seeds) == 2 + len(kernel.seed_configs(args))
    assert search_seeds(kernel, args, ConfigFile(), key, None) == kernel.seed_configs(args)


def test_a_config_of_another_key_is_the_incumbent_as_the_runtime_serves_it(cumsum_launch):
    """At the designed grid point with initial states, on the H200, the nearest configs (keys without them)
    were judged unadapted: their indexing lists lack the initial states' loads, so they were "invalid", the
    search ran against Helion's default config, and a winner as slow as the default was kept. The runtime
    serves them adapted; so must the tuner, for its incumbent and for its neighbours' seeds."""
    from mamba2_guard.core.tuneplan import COMMITTED, DEFAULT, NEAREST
    from mamba2_guard.flows.autotune_worker import incumbent_of, neighbour_seeds
    from mamba2_kernels.config_store import ConfigFile, ShapeKey

    kernel, args, key = cumsum_launch
    default = dict(kernel.bound(args).config_spec.default_config())
    assert len(default["indexing"]) > 1
    short = {"block_sizes": [2], "num_warps": 2, "indexing": ["pointer"]}  # a key whose call loads less
    other = ShapeKey.of(**{**dict(key.fields), "bias": 1 - dict(key.fields)["bias"]})
    base = ConfigFile(kernels={kernel.name: {str(other): short}})

    kind, config, why = incumbent_of(kernel, args, base, key)
    assert (kind, why) == (NEAREST, None)
    assert (config["block_sizes"], config["num_warps"], config["indexing"]) == ([2], 2, default["indexing"])
    assert [s["block_sizes"] for s in neighbour_seeds(kernel, args, base, key)] == [[2]]
    # At its own key a list of another length is drift: invalid, and the search runs against the default.
    kind, config, why = incumbent_of(kernel, args, ConfigFile(kernels={kernel.name: {str(key): short}}), key)
    assert (kind, config) == (DEFAULT, None) and "indexing" in why
    assert incumbent_of(kernel, args, ConfigFile(kernels={kernel.name: {str(key): default}}), key)[:2] == (
        COMMITTED, default)
    assert incumbent_of(kernel, args, ConfigFile(), key) == (DEFAULT, None, None)


def test_a_stored_config_that_does_not_launch_here_is_passed_over_for_the_next_as_the_runtime_does(
        cumsum_launch, monkeypatch):
    """On an H100 a nearest config needed 403 KB of shared memory at a wider headdim: its code generated, so
    the tuner took it as the search's reference, and Helion's search of that launch failed on it, while the
    runtime served the call the next candidate. The incumbent is what launches."""
    import triton.runtime.errors

    from mamba2_guard.core.tuneplan import DEFAULT, NEAREST
    from mamba2_guard.flows.autotune_worker import incumbent_of
    from mamba2_kernels.config_store import ConfigFile, ShapeKey
    from mamba2_kernels.tuning import launch_error

    kernel, args, key = cumsum_launch
    fields = dict(key.fields)
    near = ShapeKey.of(**{**fields, "tokens": fields["tokens"] * 2})  # the nearer key: ranked first
    far = ShapeKey.of(**{**fields, "tokens": fields["tokens"] * 8})
    base = ConfigFile(kernels={kernel.name: {str(near): {"block_sizes": [4], "num_warps": 8},
                                             str(far): {"block_sizes": [2], "num_warps": 2}}})
    assert incumbent_of(kernel, args, base, key)[1]["num_warps"] == 8

    def too_big(config):
        return "OutOfResources: shared memory" if config["num_warps"] == 8 else None

    kind, config, why = incumbent_of(kernel, args, base, key, launches=too_big)
    assert (kind, config["num_warps"], why) == (NEAREST, 2, "OutOfResources: shared memory")
    assert incumbent_of(kernel, args, base, key, launches=lambda config: "fails")[:2] == (DEFAULT, None)
    # The key's own config not launching is drift: the search is measured against the default, which replaces it.
    stored = {**base.kernels[kernel.name], str(key): {"block_sizes": [4], "num_warps": 8}}
    own = ConfigFile(kernels={kernel.name: stored})
    assert incumbent_of(kernel, args, own, key, launches=too_big) == (DEFAULT, None, "OutOfResources: shared memory")

    assert launch_error(kernel, args, {"block_sizes": [2], "num_warps": 2}) is None
    refused = triton.runtime.errors.OutOfResources(403476, 232448, "shared memory")
    monkeypatch.setattr(type(kernel), "helion_kernel", lambda *a, **k: (_ for _ in ()).throw(refused))
    assert "shared memory, Required: 403476" in launch_error(kernel, args, {"block_sizes": [2], "num_warps": 2})
    monkeypatch.setattr(type(kernel), "helion_kernel", lambda *a, **k: (_ for _ in ()).throw(ValueError("bug")))
    with pytest.raises(ValueError, match="bug"):  # not a refusal of the config: the kernel's own error
        launch_error(kernel, args, {"block_sizes": [2], "num_warps": 2})


def test_on_a_gpu_nobody_tuned_the_incumbent_is_the_same_architecture_gpus_config(cumsum_launch):
    """A first tune on an H100 beside the H200's file: its calls run on the H200's configs today, so a winner
    must beat those, not Helion's default; and they seed the search. Never counted as its own committed
    config, even at the same key."""
    from mamba2_guard.core.tuneplan import DEFAULT, NEAREST
    from mamba2_guard.flows.autotune_worker import incumbent_of, search_seeds
    from mamba2_kernels.config_store import ConfigFile, ShapeKey

    kernel, args, key = cumsum_launch
    far = ShapeKey.of(**{**dict(key.fields), "tokens": dict(key.fields)["tokens"] * 2})
    h200 = ConfigFile(kernels={kernel.name: {str(key): {"block_sizes": [2], "num_warps": 2},
                                             str(far): {"block_sizes": [1], "num_warps": 1}}})
    borrowed = [("nvidia-h200", h200)]
    kind, config, why = incumbent_of(kernel, args, ConfigFile(), key, borrowed)
    assert (kind, why, config["block_sizes"], config["num_warps"]) == (NEAREST, None, [2], 2)
    seeds = search_seeds(kernel, args, ConfigFile(), key, config, borrowed)
    assert seeds[0] == config
    assert ([1], 1) in [(s["block_sizes"], s["num_warps"]) for s in seeds]  # its other key's config seeds too
    own = ConfigFile(kernels={kernel.name: {str(far): {"block_sizes": [4], "num_warps": 8}}})
    assert incumbent_of(kernel, args, own, key, borrowed)[1]["block_sizes"] == [4]  # its own file first
    assert incumbent_of(kernel, args, ConfigFile(), key)[0] == DEFAULT


@pytest.mark.parametrize("field, value", [("budget_seconds", 0), ("total_budget_seconds", -5),
                                          ("job_timeout_seconds", "soon"), ("effort", "medium"),
                                          ("also_paths", {"chunk_state_passing": "sideways"})])
def test_bad_options_are_refused_by_name(tmp_path, field, value):
    with pytest.raises(ValueError, match=field.split("_seconds")[0]):
        options(tmp_path, **{field: value})


def test_a_sharded_run_splits_longest_first_by_the_job_times_of_earlier_runs(tmp_path):
    slow = {"jobs": {"chunk_state@smoke": {"sleep": 1.2}}}
    first = run_autotune(options(tmp_path, extra=slow), quiet)  # one worker: the times to split by
    assert first.complete
    messages: list[str] = []
    second = run_autotune(options(tmp_path, budget_seconds=6, devices=("0", "1")), messages.append)
    # The job's wall seconds depend on the machine's load; the line's job, launch and verdict do not.
    line = re.compile(r"chunk_cumsum@smoke \(\d+ s\): chunk_cumsum_k\[shape=smoke\] kept")
    assert any(line.match(m) for m in messages)
    by_job = {e["job"]: e["worker"] for e in second.entries}
    # The slow job alone on one GPU, the five quick ones on the other (round-robin would give 3 and 3).
    assert sorted(by_job.values()).count(by_job["chunk_state@smoke"]) == 1
    assert any("longest first" in m for m in messages)


def test_job_seconds_newest_run_wins_and_failures_do_not_count():
    older = [{"job": "a@s", "status": "ok", "seconds": 10.0}, {"job": "b@s", "status": "ok", "seconds": 4.0}]
    newer = [{"job": "a@s", "status": "ok", "seconds": 30.0}, {"job": "b@s", "status": "failed", "seconds": 99.0},
             {"job": "c@s", "status": "ok", "seconds": 0}]
    assert tuneplan.job_seconds([older, newer]) == {"a@s": 30.0, "b@s": 4.0}


def test_only_a_whole_suite_run_stamps_the_file_with_its_environment(tmp_path):
    out = tmp_path / "configs" / "fake.yaml"
    config_store.save(out, config_store.ConfigFile(fingerprint={"helion": "1.0"}, tuned={}, kernels={}))
    outcome = run_autotune(options(tmp_path, whole_suite=False), quiet)
    assert outcome.complete and config_store.load(out).fingerprint == {"helion": "1.0"}
    outcome = run_autotune(options(tmp_path, budget_seconds=6), quiet)
    assert outcome.complete and config_store.load(out).fingerprint == {"helion": "9.9"}


def test_covers_whole_suite():
    from mamba2_guard.flows.autotune import covers_whole_suite
    from mamba2_kernels import registry, suites

    every = [e.name for e in registry.select(None)]
    default = [s.name for s in suites.load().suite("default")]
    assert covers_whole_suite(every, default + ["smoke"])
    assert not covers_whole_suite(every[1:], default)
    assert not covers_whole_suite(every, default[1:])


def test_missing_only_skips_launches_whose_key_has_its_own_config():
    from mamba2_guard.flows.autotune_worker import to_search
    from mamba2_guard.flows.selection_measure import captured_launches

    captured = [(kernel, args) for kernel, args in captured_launches("smoke", 0, "cpu", "ssd_combined_fwd")] * 2
    slots = [[kernel.name, str(kernel.shape_key(*args))] for kernel, args in captured[: len(captured) // 2]]
    scan, bmm = next(s for s in slots if s[0] == "chunk_scan"), next(s for s in slots if s[0] == "bmm_chunk")
    base = config_store.ConfigFile(kernels={scan[0]: {scan[1]: {"num_warps": 4}},
                                            "chunk_state_passing": {"tokens=1": {"num_warps": 4}}})
    launches, elsewhere, had_config = to_search(captured, [bmm], base, missing_only=True)
    searched = [[kernel.name, str(key)] for kernel, _, key in launches]
    assert (elsewhere, had_config) == ([bmm], [scan])
    assert searched == [s for s in slots if s not in (scan, bmm)]  # once each, in launch order
    assert "chunk_state_passing" in [name for name, _ in searched]  # a config of another key is not its own
    launches, _, had_config = to_search(captured, [bmm], base, missing_only=False)
    assert had_config == [] and scan in [[kernel.name, str(key)] for kernel, _, key in launches]


def test_a_key_whose_own_config_does_not_run_here_is_searched(cumsum_launch, monkeypatch):
    """On an H100 whose file was withheld, a run pinned a nearest config of the state pass under a headdim-80
    key where it needs more shared memory than the GPU has (its search had failed on it as the reference).
    Skipped as searched before by later runs, and as "has a config of its own" by the later stages, the key
    ran on whatever came next for good. Such a config is drift: the key is searched, against Helion's default
    (``incumbent_of``)."""
    import triton.runtime.errors

    from mamba2_guard.flows.autotune_worker import own_config_fails, to_search
    from mamba2_kernels.config_store import ConfigFile

    kernel, args, key = cumsum_launch
    runs = {"block_sizes": [2], "num_warps": 2}
    slot = [kernel.name, str(key)]
    invalid = {"block_sizes": [2], "num_warps": 2, "indexing": ["pointer"]}  # lists of another key's length
    for own, searched in ((runs, False), (invalid, True)):
        base = ConfigFile(kernels={kernel.name: {str(key): own}})
        launches, _, had_config = to_search([(kernel, args)], [], base, True, own_config_fails)
        assert ([[k.name, str(x)] for k, _, x in launches], had_config) == (([slot], []) if searched else
                                                                            ([], [slot]))
        # A run that searched the key before (this one's earlier job, or a carried run) left it this config.
        launches, elsewhere, _ = to_search([(kernel, args)], [slot], base, False, own_config_fails)
        assert ([[k.name, str(x)] for k, _, x in launches], elsewhere) == (([slot], []) if searched else
                                                                           ([], [slot]))
    refused = triton.runtime.errors.OutOfResources(403476, 232448, "shared memory")
    monkeypatch.setattr(type(kernel), "compiled", lambda *a, **k: (_ for _ in ()).throw(refused))
    assert "shared memory" in own_config_fails(kernel, args, runs)
    base = ConfigFile(kernels={kernel.name: {str(key): runs}})
    assert to_search([(kernel, args)], [], base, True, own_config_fails)[2] == []


def test_each_launch_is_timed_per_whole_call_on_its_current_config():
    """The device times that order a job's searches: each distinct launch run through its own dispatch (the
    config the call runs today), its median counted once per launch of its key in the whole call."""
    from mamba2_guard.flows.autotune_worker import launch_device_ms

    ran = []

    class Kernel:
        def __init__(self, name):
            self.name = name

        def shape_key(self, n):
            return f"n={n}"

        def __call__(self, n):
            ran.append((self.name, n))

    class Timer:
        def interleaved(self, fns, rounds, warmup):
            for fn in fns.values():
                fn()
            return {"0": [0.2, 0.3, 0.1], "1": [0.5, 0.5, 0.5], "2": [0.1, 0.4, 0.2]}

    a, b = Kernel("a"), Kernel("b")
    captured = [(a, (1,)), (b, (1,)), (a, (1,)), (a, (2,))]  # a at n=1 twice per call
    launches = [(a, (1,), "n=1"), (b, (1,), "n=1"), (a, (2,), "n=2")]
    assert launch_device_ms(Timer(), launches, captured) == pytest.approx([0.4, 0.5, 0.2])
    assert ran == [("a", 1), ("b", 1), ("a", 2)]
    assert launch_device_ms(Timer(), [], captured) == []
