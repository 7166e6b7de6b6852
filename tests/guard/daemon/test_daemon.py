"""The daemon with real processes: child timeouts, catch-up, restarts, misfires, signals, locks, crashes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mamba2_guard.adapters.processes import run_in_child
from tests.guard.daemon import jobs
from tests.guard.live import REPO, free_port, http_get, wait_for

FAR_CRON = ["--nightly-cron", "17 3 1 1 *"]  # once a year: only the catch-up runs the nightly
CYCLE = "tests.guard.daemon.jobs:fake_cycle"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def job_ids(state: Path) -> list[str]:
    with sqlite3.connect(state / "jobs.sqlite") as conn:
        return sorted(r[0] for r in conn.execute("select id from apscheduler_jobs"))


# ----------------------------------------------------------------------------------------------
# run_in_child


def test_child_returns_value_and_reports_errors(tmp_path):
    ok = run_in_child("tests.guard.daemon.jobs:returns", 30, (41,))
    assert ok.status == "ok" and ok.value["value"] == 41 and ok.value["pid"] != os.getpid()
    bad = run_in_child(jobs.raises, 30, (tmp_path,), log_path=tmp_path / "child.log")
    assert bad.status == "error" and "illegal memory access" in bad.error
    assert "illegal memory access" in (tmp_path / "child.log").read_text()
    with pytest.raises(ValueError):
        run_in_child(lambda: 1, 5)


def test_hard_timeout_kills_the_whole_process_group(tmp_path):
    started = time.monotonic()
    res = run_in_child(CYCLE, 1.5, (tmp_path,), {"sleep_s": 120, "grandchild": True}, kill_grace_s=1)
    assert res.status == "timeout" and time.monotonic() - started < 10
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    wait_for(lambda: not alive(grandchild), 5, what="grandchild killed")
    assert not alive(res.pid)


# ----------------------------------------------------------------------------------------------
# The daemon


def test_catch_up_restart_and_one_copy_of_each_job(tmp_path, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "-o", "suite=smoke")
    d.wait_started()
    wait_for(lambda: d.count("nightly", "success") == 1, 30, what="catch-up nightly")
    assert "nightly catch-up: none has succeeded in this state directory yet; running one now" in d.output()
    assert jobs.marks(state, "cycle-start")[0]["options"] == {"suite": "smoke"}
    assert d.stop() == 0
    assert job_ids(state) == ["drift", "metrics", "nightly"]
    # Restart: the nightly just succeeded, so no catch-up; still one copy of each job.
    d2 = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE)
    d2.wait_started()
    time.sleep(1.5)
    assert len(jobs.marks(state, "cycle-start")) == 1
    assert job_ids(state) == ["drift", "metrics", "nightly"]
    assert d2.stop() == 0
    assert "catch-up" not in d2.output()
    assert json.loads((state / "latest.json").read_text())["result"]["suite"] == "default"


def test_single_instance_lock(tmp_path, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "--no-catch-up")
    d.wait_started()
    other = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE)
    assert other.proc.wait(20) == 2
    assert "another mamba2-guard daemon" in other.output() and str(d.proc.pid) in other.output()
    assert d.stop() == 0


def test_timeout_is_reported_and_the_scheduler_goes_on(tmp_path, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(state, "--nightly-interval", "2", "--nightly-timeout", "1", "--kill-grace", "0.5",
                     "--nightly-target", CYCLE, "-o", "sleep_s=60", "-o", "grandchild=true")
    d.wait_started()
    wait_for(lambda: d.count("nightly", "timeout") >= 2, 30, what="two timed-out nightlies")
    grandchild = int((state / "grandchild.pid").read_text())
    wait_for(lambda: not alive(grandchild), 5, what="grandchild killed")
    info = d.state_data()["jobs"]["nightly"]
    assert info["last_status"] == "timeout" and "last_success" not in info
    assert d.stop() == 0


def test_graceful_shutdown_waits_then_kills(tmp_path, start_daemon):
    state = tmp_path / "state"
    # A job that ends within the grace: SIGTERM waits for it and it counts as a success.
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "-o", "sleep_s=2", "--shutdown-grace", "30")
    d.wait_started()
    wait_for(lambda: jobs.marks(state, "cycle-start"), 20, what="cycle started")
    assert d.stop() == 0
    assert d.count("nightly", "success") == 1
    # A job that outlives the grace: killed (group and all) and recorded as killed.
    state2 = tmp_path / "state2"
    d = start_daemon(state2, *FAR_CRON, "--nightly-target", CYCLE, "-o", "sleep_s=120", "-o", "grandchild=true",
                     "--shutdown-grace", "1", "--kill-grace", "1")
    d.wait_started()
    wait_for(lambda: (state2 / "grandchild.pid").exists(), 20, what="cycle started")
    started = time.monotonic()
    assert d.stop(timeout=30) == 0
    assert time.monotonic() - started < 15
    assert d.count("nightly", "killed") == 1
    assert not alive(int((state2 / "grandchild.pid").read_text()))


def test_misfire_is_logged_and_counted(tmp_path, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(state, "--nightly-interval", "5", "--misfire-grace", "1", "--no-catch-up",
                     "--nightly-target", CYCLE, "-o", "snapshot=false")
    d.wait_started()
    with sqlite3.connect(state / "jobs.sqlite") as conn:
        (fire,) = conn.execute("select next_run_time from apscheduler_jobs where id = 'nightly'").fetchone()
    os.kill(d.proc.pid, signal.SIGSTOP)  # the daemon is frozen over the fire time and past the 1 s grace
    time.sleep(max(0.0, fire + 2.0 - time.time()))
    os.kill(d.proc.pid, signal.SIGCONT)
    wait_for(lambda: d.count("nightly", "missed") >= 1, 10, what="a missed run")
    assert "missed its run" in d.output()
    assert d.count("nightly", "success") == 0
    assert d.stop() == 0


def test_drift_schedules_one_retune(tmp_path, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(state, *FAR_CRON, "--no-catch-up", "--nightly-target", CYCLE, "--drift-interval", "1",
                     "--drift-target", "tests.guard.daemon.jobs:probe_drift")
    d.wait_started()
    wait_for(lambda: d.count("retune", "success") == 1, 30, what="a re-tune")
    wait_for(lambda: d.count("drift", "success") >= 3, 30, what="more drift checks")
    assert d.count("retune", "success") == 1  # the same drift does not re-tune again
    opts = [m["options"] for m in jobs.marks(state, "cycle-start")]
    assert opts == [{"force_retune": True, "reason": "drift"}]
    assert "retune" in d.state_data()["events"]
    assert d.stop() == 0


def test_kill_9_mid_job_then_restart_is_consistent(tmp_path, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "-o", "sleep_s=120", "-o", "grandchild=true")
    d.wait_started()
    wait_for(lambda: (state / "grandchild.pid").exists(), 20, what="cycle started")
    child = jobs.marks(state, "cycle-start")[0]["pid"]
    grandchild = int((state / "grandchild.pid").read_text())
    d.kill()  # SIGKILL: no handler runs
    wait_for(lambda: not alive(child) and not alive(grandchild), 10, what="orphaned children gone")
    for path in state.glob("*.json"):
        json.loads(path.read_text())  # nothing torn
    assert not list(state.glob(".*.tmp"))
    with sqlite3.connect(state / "jobs.sqlite") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    # Restart: the lock was released by the kernel; the nightly never succeeded, so it catches up.
    (state / "grandchild.pid").unlink()
    d2 = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE)
    d2.wait_started()
    wait_for(lambda: d2.count("nightly", "success") == 1, 30, what="catch-up after the crash")
    assert job_ids(state) == ["drift", "metrics", "nightly"]
    assert d2.stop() == 0


def test_corrupt_state_is_detected_and_reported(tmp_path, start_daemon):
    state = tmp_path / "state"
    state.mkdir()
    (state / "jobs.sqlite").write_bytes(b"this is not a database" * 100)
    (state / "daemon-state.json").write_text('{"version": 1, "jobs": {"nightly": ')
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE)
    d.wait_started()
    out = d.output()
    assert "job store was corrupt" in out and "daemon-state.json was unreadable" in out
    moved = sorted(p.name.split(".")[0] for p in (state / "corrupt").iterdir())
    assert moved == ["daemon-state", "jobs"]
    wait_for(lambda: d.count("nightly", "success") == 1, 30, what="a nightly on the rebuilt state")
    assert job_ids(state) == ["drift", "metrics", "nightly"]
    assert d.stop() == 0


# A job-store writer (APScheduler updates jobs.sqlite at every run) killed mid-transaction: its pages spilled
# into the file, the rollback journal beside it is hot.
KILLED_WRITER = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size=1")
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE apscheduler_jobs SET next_run_time = next_run_time + 1")
conn.execute("CREATE TABLE filler (x)")
conn.executemany("INSERT INTO filler VALUES (zeroblob(4096))", [()] * 64)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_job_store_left_by_a_killed_writer_is_rolled_back_not_called_corrupt(tmp_path, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "--no-catch-up")
    d.wait_started()
    assert d.stop() == 0
    writer = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(state / "jobs.sqlite")], timeout=60)
    assert writer.returncode == -signal.SIGKILL and (state / "jobs.sqlite-journal").stat().st_size > 0
    d2 = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "--no-catch-up")
    d2.wait_started()
    assert "job store was corrupt" not in d2.output()
    assert not list((state / "corrupt").iterdir())
    assert job_ids(state) == ["drift", "metrics", "nightly"]
    assert d2.stop() == 0
    with sqlite3.connect(state / "jobs.sqlite") as conn:  # the killed transaction was rolled back
        assert "filler" not in {r[0] for r in conn.execute("select name from sqlite_master")}


def test_undecodable_state_files_do_not_stop_the_daemon(tmp_path, start_daemon):
    """Non-UTF-8 bytes are garbage like any other: daemon-state.json moved aside, latest.json skipped."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "daemon-state.json").write_bytes(b'{"version": 1, "jobs": {"\xff\xfe\x80": 1}}')
    (state / "latest.json").write_bytes(b"\xff\xfe\x00garbage")
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "--no-catch-up")
    d.wait_started()
    assert "daemon-state.json was unreadable" in d.output()
    assert [p.name.split(".")[0] for p in (state / "corrupt").iterdir()] == ["daemon-state"]
    assert d.stop() == 0


GOOD_STATE = {"version": 1, "jobs": {"nightly": {"last_run": 1.5e9, "last_status": "success", "duration_s": 60,
                                                 "detail": None, "last_success": 1.5e9}},
              "counts": {"nightly/success": 3}, "drift_acted_on": None, "events": {"drift": 1.5e9}, "prs_opened": 1}


@pytest.mark.parametrize("edit", [{"jobs": {"nightly": 5}}, {"jobs": {"nightly": {"last_run": "yesterday"}}},
                                  {"counts": {"nightly/success": "3"}}, {"events": []}, {"prs_opened": "one"},
                                  {"version": 2}])
def test_a_hand_edited_daemon_state_is_moved_aside_not_a_crash_at_start(tmp_path, edit):
    """The daemon restores its metrics from every field of daemon-state.json at start: a field of another type
    (the daemon writes the file atomically, so a hand edit) is set aside like a torn file."""
    from mamba2_guard.adapters import state as state_mod
    from mamba2_guard.adapters.metrics import GuardMetrics

    state = state_mod.StateDir(tmp_path)
    (tmp_path / "daemon-state.json").write_text(json.dumps(GOOD_STATE))
    data, problem = state_mod.load_daemon_state(state)
    assert problem is None and data == GOOD_STATE
    GuardMetrics().restore(data)
    (tmp_path / "daemon-state.json").write_text(json.dumps({**GOOD_STATE, **edit}))
    data, problem = state_mod.load_daemon_state(state)
    assert problem.startswith("unexpected layout") and data == state_mod.empty_daemon_state()
    assert [p.name.split(".")[0] for p in (tmp_path / "corrupt").iterdir()] == ["daemon-state"]
    GuardMetrics().restore(data)


def test_a_nightly_overlapping_a_cli_nightly_is_skipped_not_an_error(tmp_path, start_daemon):
    d = start_daemon(tmp_path / "state", *FAR_CRON, "--nightly-target", "tests.guard.daemon.jobs:busy_cycle")
    d.wait_started()
    wait_for(lambda: d.count("nightly", "skipped") == 1, 30, what="the catch-up nightly, skipped")
    assert d.count("nightly", "error") == 0
    assert d.stop() == 0


def test_daemon_serves_metrics(tmp_path, start_daemon):
    state = tmp_path / "state"
    port = free_port()
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "--metrics-port", str(port))
    d.wait_started()
    first = next(line for line in d.output().splitlines() if line.startswith("mamba2-guard daemon: state"))
    assert f", metrics on http://127.0.0.1:{port}/metrics, jobs " in first, first  # the first line says where
    wait_for(lambda: d.count("nightly", "success") == 1, 30, what="nightly")

    def scraped() -> str | None:
        text = http_get(f"http://127.0.0.1:{port}/metrics").decode()
        return text if "mamba2_guard_speedup_ratio{" in text else None

    text = wait_for(scraped, 10, what="metrics from latest.json")
    assert 'mamba2_guard_runs_total{guard_job="nightly",status="success"} 1.0' in text
    assert 'mamba2_guard_last_success_timestamp_seconds{guard_job="nightly"}' in text
    assert d.stop() == 0

# A daemon whose SIGTERM lands on one of its other threads (the kernel hands a process's signal to any
# thread that does not block it): the thread sends it to itself once the scheduler runs.
SIGNAL_ON_ANOTHER_THREAD = """
import signal, sys, threading, time
from mamba2_guard import cli, daemon

def hit():
    while daemon.CTX.scheduler is None or not daemon.CTX.scheduler.running:
        time.sleep(0.05)
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=hit, daemon=True).start()
sys.exit(cli.main(["daemon", *sys.argv[1:]]))
"""


def test_a_signal_delivered_to_another_thread_stops_the_daemon(tmp_path):
    """CPython runs signal handlers in the main thread only; a main thread blocked until the next job
    (60 s away here) did not see this SIGTERM, and the daemon outlived a 30 s wait in CI."""
    args = ["--state-dir", str(tmp_path / "state"), "--metrics-port", "0", "--drift-interval", "3600",
            "--drift-target", "tests.guard.daemon.jobs:probe_no_drift", *FAR_CRON, "--nightly-target", CYCLE,
            "--no-catch-up"]
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SIGNAL_ON_ANOTHER_THREAD, *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert time.monotonic() - t0 < 30, out  # not at the next job, a minute after start
    assert "signal 15: stopping" in out and "mamba2-guard daemon: stopped" in out

