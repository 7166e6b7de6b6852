"""``mamba2-guard daemon``: APScheduler 3.x wiring, GPU work in child processes with hard timeouts.

Jobs (explicit ids, ``replace_existing=True``, so a restart keeps exactly one copy of each):

``nightly``   cron in UTC (default ``17 3 * * *``: off the hour), runs ``mamba2_guard.flows.nightly:daemon_cycle`` in a
              child process with a hard timeout.
``drift``     every 15 minutes: the fingerprint only (in a child: NVML can hang with the GPU); when a
              drift that calls for a re-tune appears that was not acted on yet, a one-off ``retune``
              job runs now (``daemon_cycle(..., force_retune=True, reason="drift")``).
``metrics``   every minute: reload ``latest.json`` (a one-shot cycle may have written it) and keep
              the staleness gauges current. ``/metrics`` itself is served by a thread from start-up.

Robustness, and why:

* job defaults ``coalesce=True, max_instances=1, misfire_grace_time=6 h``: APScheduler's 1 s default
  grace silently skips a nightly whenever the daemon is busy or was asleep;
* every GPU job runs through :func:`run_in_child`: a new session (process group), so on timeout the
  whole group (Helion's autotune workers included) is killed: SIGTERM, a grace, then SIGKILL. A hung
  GPU costs one run, reported as ``timeout``; it never wedges the scheduler. One lock serialises GPU
  jobs (a drift re-tune waits for a running nightly);
* start-up catch-up: if the last successful nightly is older than the cron period, run it now;
* SIGTERM/SIGINT: stop scheduling, wait for the running job up to ``--shutdown-grace`` seconds, then kill
  its child's process group and record the run as ``killed``. The scheduler runs in the background and
  the main thread wakes twice a second, since CPython runs signal handlers there only, whichever thread
  the kernel handed the signal to;
* missed, skipped, failed and timed-out runs are logged and counted (``mamba2_guard_runs_total``);
* one daemon per state directory (``filelock``; the kernel releases it when the process dies);
* ``jobs.sqlite`` is checked before use; a corrupt one is moved aside and rebuilt. At every start it is
  emptied and the jobs are rebuilt from the configuration, and while running it restores only the daemon's
  own jobs through a restricted unpickler (``mamba2_guard.adapters.jobstore``): a row someone else wrote is
  never run. ``daemon-state.json`` is written atomically;
* a watchdog: the ``metrics`` job is the scheduler's heartbeat (``mamba2_guard_scheduler_last_tick_timestamp_seconds``
  and the next due run on ``/metrics``). When no tick came for ``WATCHDOG_TICKS`` of its periods (the
  scheduler's thread died, on a full disk say, or its job store fails on every read) or the scheduler stopped,
  the daemon moves a corrupt store aside and exits with ``EXIT_STALLED``, which systemd's
  ``Restart=on-failure`` restarts: the process never stays up doing nothing;
* SIGHUP reloads: the settings file (``<state>/guard.yaml``) is read by each cycle anyway, so the daemon
  checks it now and says whether the next cycle can use it; the command line's settings (cron, ports) need
  a restart. An invalid settings file stops the daemon at start instead (exit 2).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from mamba2_guard import DEFAULT_METRICS_PORT, DEFAULT_NIGHTLY_CRON, DRIFT_TARGET, EXIT_BUSY, NIGHTLY_TARGET
from mamba2_guard.adapters import jobstore
from mamba2_guard.adapters import metrics as metrics_mod
from mamba2_guard.adapters.processes import kill_children, remove_orphaned_child_dirs, run_in_child, target_ref
from mamba2_guard.adapters.state import (
    AlreadyRunning,
    InstanceLock,
    StateDir,
    ensure_healthy_jobstore,
    load_daemon_state,
    write_json,
)

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_STALLED = 3  # the watchdog: not 2, which the systemd unit does not restart
WATCHDOG_TICKS = 3  # heartbeats missed before the watchdog fires
WATCHDOG_MIN_S = 10.0


# ----------------------------------------------------------------------------------------------
# Configuration and per-process context


@dataclass
class DaemonConfig:
    state_dir: Path
    nightly_cron: str = DEFAULT_NIGHTLY_CRON
    nightly_interval_s: float | None = None  # instead of the cron (tests, or a fleet on a fixed cadence)
    nightly_timeout_s: float = 6 * 3600
    nightly_target: str = NIGHTLY_TARGET
    nightly_options: dict[str, Any] = field(default_factory=dict)
    drift_interval_s: float = 900
    drift_timeout_s: float = 300
    drift_target: str = DRIFT_TARGET
    metrics_interval_s: float = 60
    metrics_port: int | None = DEFAULT_METRICS_PORT
    metrics_addr: str = "127.0.0.1"
    misfire_grace_s: float = 6 * 3600
    shutdown_grace_s: float = 120
    kill_grace_s: float = 10
    catch_up: bool = True

    def to_job_kwargs(self) -> dict[str, Any]:
        """What a job needs, as plain data (jobs are pickled into the job store)."""
        return {"state_dir": str(self.state_dir), "nightly_target": self.nightly_target,
                "nightly_timeout_s": self.nightly_timeout_s, "nightly_options": dict(self.nightly_options),
                "drift_target": self.drift_target, "drift_timeout_s": self.drift_timeout_s,
                "kill_grace_s": self.kill_grace_s}


class _Context:
    """Process-wide daemon state shared by the job functions (jobs run on the scheduler's threads)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.gpu_lock = threading.Lock()
        self.metrics = metrics_mod.GuardMetrics()
        self.state: StateDir | None = None
        self.data: dict[str, Any] = {}
        self.scheduler: Any = None
        self.config: DaemonConfig | None = None
        self.active = 0
        self.idle = threading.Condition(self.lock)
        self.latest_mtime: float | None = None
        self.last_tick = time.time()
        self.metrics_url: str | None = None  # where /metrics is served (the port bound, also for --metrics-port 0)

    def save(self) -> None:
        if self.state is not None:
            write_json(self.state.daemon_state, self.data)


CTX = _Context()


def _record(job: str, status: str, started: float, finished: float, detail: str | None = None) -> None:
    with CTX.lock:
        jobs = CTX.data.setdefault("jobs", {})
        info = jobs.setdefault(job, {})
        counts = CTX.data.setdefault("counts", {})
        key = f"{job}/{status}"
        counts[key] = counts.get(key, 0) + 1
        if status not in ("missed", "skipped"):
            info.update(last_run=finished, last_status=status, duration_s=finished - started, detail=detail)
            if status in ("success", "regression"):
                info["last_success"] = finished
        CTX.save()
    CTX.metrics.record_run(job, status, started, finished)
    level = logging.INFO if status in ("success", "regression") else logging.ERROR
    log.log(level, "job %s: %s%s", job, status, f" ({detail})" if detail else "")


class _Active:
    def __enter__(self) -> None:
        with CTX.lock:
            CTX.active += 1

    def __exit__(self, *exc: object) -> None:
        with CTX.lock:
            CTX.active -= 1
            CTX.idle.notify_all()


def _cycle(job: str, state_dir: str, target: str, timeout_s: float, options: Mapping[str, Any],
           kill_grace_s: float) -> str:
    state = StateDir(Path(state_dir))
    with _Active(), CTX.gpu_lock:
        started = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
        result = run_in_child(target, timeout_s, (state.root,), options, log_path=state.logs / f"{job}-{stamp}.log",
                              kill_grace_s=kill_grace_s)
        finished = time.time()
        if result.status == "ok":
            rc = result.value if isinstance(result.value, int) else 0
            status = {0: "success", 1: "regression", EXIT_BUSY: "skipped"}.get(rc, "error")
            detail = {"error": f"exit code {rc}", "skipped": "another cycle holds the state dir"}.get(status)
        else:
            status = result.status
            lines = (result.error or "").strip().splitlines()
            detail = lines[-1] if lines else None
        if status not in ("success", "regression") and result.log_path:
            detail = f"{detail}; log {result.log_path}"
        _record(job, status, started, finished, detail)
        _refresh_snapshot(force=True)
        return status


def nightly_job(state_dir: str, nightly_target: str = NIGHTLY_TARGET, nightly_timeout_s: float = 6 * 3600,
                nightly_options: Mapping[str, Any] | None = None, kill_grace_s: float = 10.0, **_: Any) -> str:
    """The scheduled nightly: one ``daemon_cycle`` in a child process."""
    return _cycle("nightly", state_dir, nightly_target, nightly_timeout_s, dict(nightly_options or {}), kill_grace_s)


def retune_job(state_dir: str, nightly_target: str = NIGHTLY_TARGET, nightly_timeout_s: float = 6 * 3600,
               nightly_options: Mapping[str, Any] | None = None, kill_grace_s: float = 10.0,
               reason: str = "drift", **_: Any) -> str:
    """A one-off cycle with ``force_retune=True`` (scheduled by the drift watch)."""
    options = dict(nightly_options or {}, force_retune=True, reason=reason)
    return _cycle("retune", state_dir, nightly_target, nightly_timeout_s, options, kill_grace_s)


def probe_drift(state_dir: Path) -> dict[str, Any]:
    """Child side of the drift watch: the fingerprint, classified against the recorded configs/baseline."""
    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.flows.nightly import detect_drift

    fp = fingerprint.collect()
    return {"fingerprint": fp.to_dict(), "drift": detect_drift(fp).to_dict()}


def drift_key(report: Mapping[str, Any]) -> str:
    """What identifies one drift (so one drift triggers one re-tune, not one every 15 minutes)."""
    import hashlib
    import json

    items = sorted((i.get("class"), i.get("component"), str(i.get("after"))) for i in report.get("items") or []
                   if i.get("action") == "retune")
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def drift_job(state_dir: str, drift_target: str = DRIFT_TARGET, drift_timeout_s: float = 300,
              kill_grace_s: float = 10.0, **job_kwargs: Any) -> str:
    """Fingerprint only; on a new drift that calls for a re-tune, schedule ``retune`` now."""
    with _Active():
        started = time.time()
        result = run_in_child(drift_target, drift_timeout_s, (Path(state_dir),), kill_grace_s=kill_grace_s)
        finished = time.time()
        if result.status != "ok" or not isinstance(result.value, Mapping):
            _record("drift", result.status if result.status != "ok" else "error", started, finished,
                    (result.error or "no report").strip().splitlines()[-1])
            return "error"
        report = result.value.get("drift") or {}
        CTX.metrics.update_drift(report, result.value.get("fingerprint"))
        status = "success"
        if report.get("action") == "retune":
            key = drift_key(report)
            with CTX.lock:
                new = CTX.data.get("drift_acted_on") != key
                if new:
                    CTX.data["drift_acted_on"] = key
                    CTX.data.setdefault("events", {})["drift"] = finished
                    CTX.save()
            if new:
                log.warning("drift needs a re-tune (%s): scheduling one now", key)
                CTX.metrics.record_event("drift", finished)
                _schedule_retune(state_dir, job_kwargs, kill_grace_s, drift_target, drift_timeout_s)
        _record("drift", status, started, finished)
        return status


def _schedule_retune(state_dir: str, job_kwargs: Mapping[str, Any], kill_grace_s: float, drift_target: str,
                     drift_timeout_s: float) -> None:
    sched = CTX.scheduler
    if sched is None:
        return
    kwargs = {"state_dir": state_dir, "kill_grace_s": kill_grace_s, "drift_target": drift_target,
              "drift_timeout_s": drift_timeout_s, **job_kwargs, "reason": "drift"}
    sched.add_job(retune_job, trigger="date", run_date=datetime.now(timezone.utc), id="retune",
                  name="re-tune after drift", kwargs=kwargs, replace_existing=True)
    with CTX.lock:
        CTX.data.setdefault("events", {})["retune"] = time.time()
        CTX.save()
    CTX.metrics.record_event("retune", time.time())


def _refresh_snapshot(force: bool = False) -> None:
    state = CTX.state
    if state is None:
        return
    try:
        mtime = state.latest.stat().st_mtime
    except FileNotFoundError:
        return
    if (force or mtime != CTX.latest_mtime) and CTX.metrics.load_snapshot(state.latest):
        CTX.latest_mtime = mtime


def metrics_job(**_: Any) -> str:
    """The scheduler's heartbeat: its time and the next due run on ``/metrics`` for the watchdog and for
    Prometheus; and reload ``latest.json`` when it changed (a one-shot cycle may have written it)."""
    CTX.last_tick = time.time()
    due = None
    if CTX.scheduler is not None:
        with contextlib.suppress(Exception):  # a failing store: the missing ticks will tell
            due = min((j.next_run_time for j in CTX.scheduler.get_jobs() if j.next_run_time), default=None)
    CTX.metrics.update_liveness(CTX.last_tick, due.timestamp() if due else None)
    _refresh_snapshot()
    return "success"


def stalled(config: DaemonConfig, last_tick: float, running: bool, now: float | None = None) -> str | None:
    """Why the watchdog fires, or None: the scheduler stopped, or its heartbeat is overdue."""
    if not running:
        return "the scheduler stopped"
    limit = max(WATCHDOG_TICKS * config.metrics_interval_s, WATCHDOG_MIN_S)
    late = (now or time.time()) - last_tick
    if late > limit:
        return (f"no heartbeat for {late:.0f} s (limit {limit:.0f} s): the scheduler's thread died or its job store "
                "fails on every read")
    return None


def reload_settings(state: StateDir) -> str:
    """SIGHUP: whether the next cycle can use ``<state>/guard.yaml`` (each cycle reads it)."""
    from mamba2_guard import config as guard_config

    try:
        cfg = guard_config.load(None, state.root)
    except guard_config.GuardConfigError as exc:
        return f"SIGHUP: the next cycle cannot use the settings: {exc}"
    return f"SIGHUP: settings ok ({cfg.describe()}); each cycle reads them, the command line's need a restart"


# ----------------------------------------------------------------------------------------------
# Scheduler wiring


def _nightly_trigger(config: DaemonConfig):
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    if config.nightly_interval_s is not None:
        return IntervalTrigger(seconds=config.nightly_interval_s, timezone=timezone.utc)
    return CronTrigger.from_crontab(config.nightly_cron, timezone=timezone.utc)


def nightly_period(trigger, now: datetime | None = None) -> timedelta:
    """The gap between two consecutive fire times of the nightly trigger (24 h for a daily cron)."""
    now = now or datetime.now(timezone.utc)
    first = trigger.get_next_fire_time(None, now)
    second = trigger.get_next_fire_time(first, first + timedelta(microseconds=1))
    return second - first


def build_scheduler(config: DaemonConfig, catch_up: bool = False):
    from apscheduler.events import (
        EVENT_JOB_ERROR,
        EVENT_JOB_MAX_INSTANCES,
        EVENT_JOB_MISSED,
        EVENT_SCHEDULER_STARTED,
    )
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    state = StateDir(config.state_dir)
    sched = BackgroundScheduler(
        jobstores={"default": jobstore.TrustedJobStore(state.jobstore_url, JOB_REFS)},
        executors={"default": ThreadPoolExecutor(4)},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": int(config.misfire_grace_s)},
        timezone=timezone.utc,
    )
    kw = config.to_job_kwargs()
    # Re-adding replaces the stored copy (and its stored next run time: a run missed while the daemon
    # was down is the catch-up's business, decided from daemon-state.json, not APScheduler's).
    extra = {"next_run_time": datetime.now(timezone.utc)} if catch_up else {}
    sched.add_job(nightly_job, _nightly_trigger(config), id="nightly", name="nightly cycle", kwargs=kw,
                  replace_existing=True, **extra)
    sched.add_job(drift_job, "interval", seconds=config.drift_interval_s, id="drift", name="drift watch",
                  kwargs=kw, replace_existing=True)
    sched.add_job(metrics_job, "interval", seconds=config.metrics_interval_s, id="metrics",
                  name="metrics refresh", replace_existing=True)

    def on_event(event) -> None:
        job = event.job_id
        now = time.time()
        if event.code == EVENT_JOB_MISSED:
            log.error("job %s missed its run at %s (daemon down or busy past the grace time)",
                      event.job_id, event.scheduled_run_time)
            _record(job, "missed", now, now, f"scheduled {event.scheduled_run_time}")
        elif event.code == EVENT_JOB_MAX_INSTANCES:
            log.error("job %s skipped: the previous run is still going", event.job_id)
            _record(job, "skipped", now, now, "previous run still going")
        elif event.code == EVENT_JOB_ERROR:
            log.error("job %s raised: %s", event.job_id, event.exception)
            _record(job, "error", now, now, repr(event.exception))

    def on_started(_event) -> None:
        metrics = f"metrics on {CTX.metrics_url}, " if CTX.metrics_url else "no metrics server, "
        print(f"mamba2-guard daemon: state {state.root}, pid {os.getpid()}, {metrics}jobs "
              + ", ".join(f"{j.id} (next {j.next_run_time:%Y-%m-%d %H:%M:%S %Z})" for j in sched.get_jobs()),
              flush=True)

    sched.add_listener(on_event, EVENT_JOB_MISSED | EVENT_JOB_ERROR | EVENT_JOB_MAX_INSTANCES)
    sched.add_listener(on_started, EVENT_SCHEDULER_STARTED)
    return sched


# The callables the job store may restore: the daemon's own jobs (``adapters.jobstore``).
JOB_REFS = frozenset(f"{__name__}:{job.__name__}" for job in (nightly_job, retune_job, drift_job, metrics_job))


def catch_up_needed(config: DaemonConfig, data: Mapping[str, Any], now: float | None = None) -> bool:
    """True when the last successful nightly is older than the nightly period (or there never was one)."""
    now = now or time.time()
    last = ((data.get("jobs") or {}).get("nightly") or {}).get("last_success")
    if last is None:
        return True
    period = nightly_period(_nightly_trigger(config)).total_seconds()
    return now - float(last) > period


def _wait_idle(limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    with CTX.lock:
        while CTX.active > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            CTX.idle.wait(min(left, 0.5))
    return True


def run_daemon(config: DaemonConfig) -> int:
    """Run until SIGTERM/SIGINT. Exit 0 after a clean stop, 2 when another daemon holds the state dir."""
    state = StateDir(Path(config.state_dir)).ensure()
    lock = InstanceLock(state)
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        print(f"mamba2-guard: {exc}", file=sys.stderr)
        return EXIT_USAGE
    server = None
    try:
        remove_orphaned_child_dirs()  # a daemon killed with SIGKILL left its children's temp dirs
        CTX.__init__()
        CTX.state, CTX.config = state, config
        problem = ensure_healthy_jobstore(state)
        if problem:
            CTX.metrics.record_state_error("jobs.sqlite")
            print(f"mamba2-guard: job store was corrupt ({problem}); moved to {state.corrupt} and rebuilt",
                  file=sys.stderr)
        jobstore.clear(state.jobstore)  # rebuilt from the configuration below: nothing is loaded from disk
        CTX.data, problem = load_daemon_state(state)
        if problem:
            CTX.metrics.record_state_error("daemon-state.json")
            print(f"mamba2-guard: {state.daemon_state} was unreadable ({problem}); starting fresh", file=sys.stderr)
        CTX.metrics.restore(CTX.data)
        _refresh_snapshot(force=True)
        if config.metrics_port is not None:
            try:
                server = CTX.metrics.serve(config.metrics_port, config.metrics_addr)
            except OSError as exc:  # a bad address, a port in use
                print(f"mamba2-guard: --metrics-addr {config.metrics_addr} --metrics-port {config.metrics_port}: "
                      f"{exc.strerror or exc}", file=sys.stderr)
                return EXIT_USAGE
            CTX.metrics_url = f"http://{config.metrics_addr}:{server[0].server_address[1]}/metrics"
        catch_up = config.catch_up and catch_up_needed(config, CTX.data)
        if catch_up:
            never = ((CTX.data.get("jobs") or {}).get("nightly") or {}).get("last_success") is None
            log.warning("nightly catch-up: %s; running one now", "none has succeeded in this state directory yet"
                        if never else "the last success is older than its period")
        sched = build_scheduler(config, catch_up=catch_up)
        CTX.scheduler = sched
        stopping = threading.Event()
        reloads: list[int] = []
        outcome = EXIT_OK

        def on_signal(signum, _frame) -> None:
            if signum == signal.SIGHUP:
                reloads.append(signum)  # logged by the main loop: no file reading inside a signal handler
                return
            if not stopping.is_set():
                log.warning("signal %d: stopping (waiting up to %.0f s for a running job)", signum,
                            config.shutdown_grace_s)
            stopping.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        try:
            sched.start()  # jobs run in the scheduler's threads
            CTX.last_tick = time.time()
            # CPython runs signal handlers in the main thread only, and a signal that the kernel hands to
            # another thread does not wake a wait blocked here: so wake twice a second. (Blocked in a
            # BlockingScheduler until its next job, the daemon once outlived 30 s after SIGTERM.)
            while not stopping.wait(0.5):
                while reloads:
                    reloads.pop()
                    print(f"mamba2-guard daemon: {reload_settings(state)}", flush=True)
                why = stalled(config, CTX.last_tick, sched.running)
                if why:
                    problem = ensure_healthy_jobstore(state)
                    moved = f"; the corrupt job store ({problem}) was moved to {state.corrupt}" if problem else ""
                    print(f"mamba2-guard daemon: watchdog: {why}{moved}; exiting {EXIT_STALLED} so that the service "
                          "manager restarts it", file=sys.stderr, flush=True)
                    outcome = EXIT_STALLED
                    break
            with contextlib.suppress(Exception):  # a scheduler whose thread died may not shut down cleanly
                sched.shutdown(wait=False)
        finally:
            if not _wait_idle(config.shutdown_grace_s):
                n = kill_children(config.kill_grace_s)
                log.error("shutdown: the running job outlived the %.0f s grace; killed %d child(ren)",
                          config.shutdown_grace_s, n)
                _wait_idle(config.kill_grace_s + 15)
            for s, h in previous.items():
                signal.signal(s, h)
        print("mamba2-guard daemon: stopped", flush=True)
        return outcome
    finally:
        if server is not None:
            server[0].shutdown()
        CTX.scheduler = None
        lock.release()


# ----------------------------------------------------------------------------------------------
# `mamba2-guard daemon`


def config_from_args(args: argparse.Namespace) -> DaemonConfig:
    return DaemonConfig(
        state_dir=Path(args.state_dir), nightly_cron=args.nightly_cron, nightly_interval_s=args.nightly_interval,
        nightly_timeout_s=args.nightly_timeout, nightly_target=args.nightly_target,
        nightly_options=dict(args.option), drift_interval_s=args.drift_interval, drift_timeout_s=args.drift_timeout,
        drift_target=args.drift_target, metrics_interval_s=args.metrics_interval,
        metrics_port=args.metrics_port or None, metrics_addr=args.metrics_addr, misfire_grace_s=args.misfire_grace,
        shutdown_grace_s=args.shutdown_grace, kill_grace_s=args.kill_grace, catch_up=not args.no_catch_up,
    )


def cmd_daemon(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        target_ref(config.nightly_target)
        _nightly_trigger(config)
    except ValueError as exc:
        print(f"mamba2-guard: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run_daemon(config)
