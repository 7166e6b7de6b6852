"""The daemon never stays up doing nothing, never runs a job it did not write, and reloads on SIGHUP: a real
daemon process each time, its job store a real SQLite file."""

from __future__ import annotations

import os
import pickle
import signal
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path

from mamba2_guard.adapters.metrics import GuardMetrics
from mamba2_guard.daemon import DaemonConfig, stalled
from tests.guard.live import wait_for

FAR_CRON = ["--nightly-cron", "17 3 1 1 *"]  # once a year: the nightly never runs on its own here
CYCLE = "tests.guard.daemon.jobs:fake_cycle"


def planted_store_job(path: Path, command: str) -> None:
    """A job running ``command``, due now, added with APScheduler's own SQLite store (no scheduler running):
    what anyone who can write the state directory could leave there."""
    import types

    from apscheduler.job import Job
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.triggers.date import DateTrigger

    now = datetime.now(timezone.utc)
    store = SQLAlchemyJobStore(url=f"sqlite:///{path}")
    store.start(None, "default")
    store.add_job(Job(types.SimpleNamespace(timezone=timezone.utc), id="planted", func=os.system, args=[command],
                      kwargs={}, trigger=DateTrigger(now), executor="default", name="planted",
                      misfire_grace_time=3600, coalesce=True, max_instances=1, next_run_time=now))
    store.shutdown()


class _RunsOnLoad:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def planted_pickle_row(path: Path, command: str) -> None:
    """A row, due now, whose pickle runs ``command`` when unpickled."""
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO apscheduler_jobs (id, next_run_time, job_state) VALUES (?, ?, ?)",
                   ("planted-pickle", time.time() - 1, pickle.dumps(_RunsOnLoad(command))))


def test_a_job_planted_in_the_store_is_never_run(tmp_path, start_daemon):
    state = tmp_path / "state"
    state.mkdir()
    before, during = tmp_path / "ran-before-start", tmp_path / "ran-while-running"
    planted_store_job(state / "jobs.sqlite", f"touch {before}")  # with APScheduler's own store, due now
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "--no-catch-up", "--metrics-interval", "1")
    d.wait_started()
    planted_pickle_row(state / "jobs.sqlite", f"touch {during}")  # a pickle that runs a command when loaded
    wait_for(lambda: "not one of the daemon's jobs" in d.output() or "never stores" in d.output(), 20,
             what="the planted row refused")
    time.sleep(2)
    assert not before.exists() and not during.exists(), d.output()
    assert d.proc.poll() is None
    assert d.stop() == 0


def test_a_job_store_that_fails_while_running_makes_the_daemon_exit_for_a_restart(tmp_path, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "--no-catch-up", "--metrics-interval", "1")
    d.wait_started()
    (state / "jobs.sqlite").write_bytes(b"this is not a database" * 200)  # corrupted under the running daemon
    assert d.proc.wait(90) == 3, d.output()
    assert "watchdog: no heartbeat" in d.output() and "moved to" in d.output()
    again = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "--no-catch-up", "--metrics-interval", "1")
    again.wait_started()  # the restart systemd makes: a fresh store, rebuilt from the configuration
    wait_for(lambda: again.count("metrics", "success") >= 1 or "job metrics" in again.output()
             or (state / "jobs.sqlite").stat().st_size > 0, 20, what="the restarted daemon's jobs")
    assert again.stop() == 0


def test_the_watchdog_fires_on_a_stopped_scheduler_or_an_overdue_heartbeat():
    config = DaemonConfig(state_dir=None, metrics_interval_s=20)
    assert stalled(config, last_tick=1000.0, running=True, now=1059.0) is None
    assert "no heartbeat for 61 s (limit 60 s)" in stalled(config, last_tick=1000.0, running=True, now=1061.0)
    assert stalled(config, last_tick=1000.0, running=False, now=1000.0) == "the scheduler stopped"
    quick = DaemonConfig(state_dir=None, metrics_interval_s=1)
    assert stalled(quick, last_tick=1000.0, running=True, now=1009.0) is None  # never under 10 s


def test_the_heartbeat_is_on_metrics():
    metrics = GuardMetrics()
    due = datetime(2026, 12, 6, 3, 17, tzinfo=timezone.utc).timestamp()
    metrics.update_liveness(1_765_000_000.0, due)
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.exposition().decode().splitlines()
              if line.startswith("mamba2_guard_scheduler_")}
    assert values == {"mamba2_guard_scheduler_last_tick_timestamp_seconds": 1_765_000_000.0,
                      "mamba2_guard_scheduler_next_due_timestamp_seconds": due}


def test_sighup_checks_the_settings_and_keeps_running(tmp_path, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE, "--no-catch-up")
    d.wait_started()
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "SIGHUP: settings ok" in d.output(), 10, what="the reload's line")
    (state / "guard.yaml").write_text("policy: {overrides: [1]}\nnot_a_section: 1\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "SIGHUP: the next cycle cannot use the settings" in d.output(), 10, what="the bad file named")
    assert d.proc.poll() is None and "guard.yaml" in d.output()
    assert d.stop() == 0


def test_the_daemon_refuses_to_start_with_invalid_settings(tmp_path, start_daemon):
    state = tmp_path / "state"
    state.mkdir()
    (state / "guard.yaml").write_text("autotune: {budget_seconds: fast}\n")
    d = start_daemon(state, *FAR_CRON, "--nightly-target", CYCLE)
    assert d.proc.wait(30) == 2
    lines = [line for line in d.output().splitlines() if line.strip()]
    assert len(lines) == 1 and "guard.yaml" in lines[0] and "budget_seconds" in lines[0]
