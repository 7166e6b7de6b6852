"""The daemon's state directory: its layout, the single-instance lock, and crash-safe small files.

Layout (everything the daemon writes lives under one folder, ``--state-dir``)::

    <state>/daemon.lock          filelock: one daemon per state dir (released by the kernel on any exit)
    <state>/daemon.pid           pid of the daemon holding the lock (informational)
    <state>/jobs.sqlite          APScheduler's SQLAlchemyJobStore (pure cache: re-created from the CLI's
                                 job definitions at every start, so a corrupt one is moved aside, never fatal)
    <state>/daemon-state.json    per-job last run / last success / counts, drift keys already acted on
    <state>/latest.json          the last cycle's snapshot for metrics: {result, verdicts, drift, events}
    <state>/logs/<job>-<stamp>.log   stdout+stderr of each child process
    <state>/metrics/mamba2_guard.prom  node-exporter textfile (one-shot runs)
    <state>/corrupt/             files that failed to load, moved aside with a timestamp

Every JSON file is written through a temp file + fsync + rename, so a kill -9 at any point leaves the old
or the new version, never a torn one. A file that still fails to parse (disk trouble, a hand edit) is
moved to ``corrupt/`` and reported; the daemon starts with defaults instead of crashing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mamba2_kernels.files import UnreadableFile, atomic_write, load_json, state_dir

log = logging.getLogger(__name__)


# ``$MAMBA2_GUARD_STATE``, else ``$XDG_STATE_HOME/mamba2-guard``: the training jobs' seen-keys file lives there
default_state_dir = state_dir

JOBSTORE = "jobs.sqlite"
LOCK = "daemon.lock"
PIDFILE = "daemon.pid"
DAEMON_STATE = "daemon-state.json"
LATEST = "latest.json"
STATE_VERSION = 1


class AlreadyRunning(RuntimeError):
    """Another daemon holds this state directory's lock."""


@dataclass(frozen=True)
class StateDir:
    root: Path

    @property
    def jobstore(self) -> Path:
        return self.root / JOBSTORE

    @property
    def jobstore_url(self) -> str:
        return f"sqlite:///{self.jobstore}"

    @property
    def lock(self) -> Path:
        return self.root / LOCK

    @property
    def pidfile(self) -> Path:
        return self.root / PIDFILE

    @property
    def daemon_state(self) -> Path:
        return self.root / DAEMON_STATE

    @property
    def latest(self) -> Path:
        return self.root / LATEST

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def textfile(self) -> Path:
        return self.root / "metrics" / "mamba2_guard.prom"

    @property
    def corrupt(self) -> Path:
        return self.root / "corrupt"

    def ensure(self) -> StateDir:
        for d in (self.root, self.logs, self.corrupt):
            d.mkdir(parents=True, exist_ok=True)
        return self


# ----------------------------------------------------------------------------------------------
# Atomic small files


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def move_aside(path: Path, corrupt_dir: Path, reason: str) -> Path:
    """Move a file that cannot be read to ``corrupt_dir`` (timestamped) and log why."""
    corrupt_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = corrupt_dir / f"{path.name}.{stamp}.{os.getpid()}"
    os.replace(path, target)
    log.error("state: %s is unreadable (%s); moved to %s and starting fresh", path, reason, target)
    return target


def read_json(path: Path, corrupt_dir: Path | None = None) -> tuple[Any, str | None]:
    """(data, problem). Missing file -> (None, None). Unparseable -> moved aside, (None, reason)."""
    try:
        return load_json(path), None  # bytes: undecodable ones are a JSON error too
    except FileNotFoundError:
        return None, None
    except UnreadableFile as exc:  # a FIFO, a link to /dev/zero: named, never moved (it is not ours)
        return None, str(exc)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        reason = f"not valid JSON: {exc}"
        if corrupt_dir is not None:
            move_aside(path, corrupt_dir, reason)
        return None, reason


# ----------------------------------------------------------------------------------------------
# The job store: checked before APScheduler opens it


def check_sqlite(path: Path) -> str | None:
    """None when ``path`` is absent or a healthy SQLite database, else why not."""
    if not path.exists():
        return None
    try:
        with path.open("rb") as handle:
            head = handle.read(16)
    except OSError as exc:
        return f"cannot read: {exc}"
    if path.stat().st_size and head != b"SQLite format 3\x00":
        return "not an SQLite database (bad header)"
    try:
        # Read-write (never created here): a writer killed mid-transaction leaves a hot journal, which only
        # a connection that may write rolls back; read-only, SQLite refuses the healthy file instead.
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=5)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return f"SQLite error: {exc}"
    if rows != [("ok",)]:
        return "integrity check failed: " + "; ".join(str(r[0]) for r in rows[:5])
    return None


def ensure_healthy_jobstore(state: StateDir) -> str | None:
    """Move a corrupt job store aside (with its -wal/-journal files). Returns the problem, if any.

    The job store holds nothing that cannot be rebuilt: the daemon re-adds every job with
    ``replace_existing=True`` at start, and run bookkeeping lives in ``daemon-state.json``.
    """
    problem = check_sqlite(state.jobstore)
    if problem is None:
        return None
    move_aside(state.jobstore, state.corrupt, problem)
    for suffix in ("-wal", "-shm", "-journal"):
        side = state.jobstore.with_name(state.jobstore.name + suffix)
        if side.exists():
            move_aside(side, state.corrupt, "belongs to a corrupt job store")
    return problem


# ----------------------------------------------------------------------------------------------
# Per-job bookkeeping


def empty_daemon_state() -> dict[str, Any]:
    return {"version": STATE_VERSION, "jobs": {}, "counts": {}, "drift_acted_on": None, "events": {},
            "prs_opened": 0}


def _layout_problem(data: Any) -> str | None:
    """What a daemon-state.json holds that the daemon did not write (it writes atomically: a hand edit, another
    version), or None. The daemon restores its metrics from every field at start, so a field of another type
    would stop it there."""
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        return f"unexpected layout (version {data.get('version') if isinstance(data, dict) else None!r})"

    def number(value: Any) -> bool:
        return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))

    def numbers(mapping: Any, keys: Any = None) -> bool:
        return isinstance(mapping, dict) and all(number(value) for key, value in mapping.items()
                                                 if keys is None or key in keys)

    jobs, times = data.get("jobs"), ("last_run", "last_success", "duration_s")
    for field, ok in (("jobs", isinstance(jobs, dict) and all(numbers(info, times) for info in jobs.values())),
                      ("counts", numbers(data.get("counts", {}))), ("events", numbers(data.get("events", {}))),
                      ("prs_opened", number(data.get("prs_opened", 0)))):
        if not ok:
            return f"unexpected layout ({field})"
    return None


def load_daemon_state(state: StateDir) -> tuple[dict[str, Any], str | None]:
    """The bookkeeping file, or a fresh one (with the reason) when it is absent or unreadable."""
    data, problem = read_json(state.daemon_state, state.corrupt)
    if data is None:
        return empty_daemon_state(), problem
    reason = _layout_problem(data)
    if reason:
        move_aside(state.daemon_state, state.corrupt, reason)
        return empty_daemon_state(), reason
    fresh = empty_daemon_state()
    fresh.update(data)
    return fresh, None


# ----------------------------------------------------------------------------------------------
# Single instance


@contextlib.contextmanager
def exclusive(path: Path, busy: type[Exception], holder: str) -> Iterator[None]:
    """Hold the file lock ``path`` inside the block, without waiting: ``busy`` naming it when ``holder`` (as
    "another <holder> holds <path>") has it. An flock, so the kernel drops it when its holder dies."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout as exc:
        raise busy(f"another {holder} holds {lock.lock_file}") from exc
    try:
        yield
    finally:
        lock.release()


class InstanceLock:
    """One daemon per state directory: a non-blocking ``filelock`` on ``daemon.lock``.

    The lock is an flock on an open file, so the kernel drops it when the holder dies (kill -9
    included): no stale lock to clean up by hand.
    """

    def __init__(self, state: StateDir):
        from filelock import FileLock

        self.state = state
        self._lock = FileLock(str(state.lock), timeout=0)

    def acquire(self) -> InstanceLock:
        from filelock import Timeout

        self.state.root.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            holder = "unknown pid"
            with contextlib.suppress(OSError, ValueError):
                holder = f"pid {int(self.state.pidfile.read_text().strip())}"
            raise AlreadyRunning(
                f"another mamba2-guard daemon ({holder}) holds {self.state.lock}; one daemon per state dir"
            ) from None
        atomic_write(self.state.pidfile, f"{os.getpid()}\n")
        return self

    def release(self) -> None:
        if self._lock.is_locked:
            self.state.pidfile.unlink(missing_ok=True)
            self._lock.release()

    def __enter__(self) -> InstanceLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
