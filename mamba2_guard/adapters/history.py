"""SQLite run history: every bench run and its per-case numbers and verdicts, in the state dir.

* WAL journal, ``synchronous=FULL``; each run is written in one ``BEGIN IMMEDIATE`` transaction,
  so a killed process leaves either the whole run or none of it.
* On open, ``PRAGMA integrity_check``; a damaged or foreign file raises :class:`HistoryCorrupt`
  naming it (move it aside and start a new history; nothing else depends on it).
* :meth:`History.window` hands ``judge`` the earlier runs of one case since the last fingerprint
  change (the window resets when the environment changes).

Timestamps are ISO 8601 in UTC; the caller passes ``now`` (this module reads no clock).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import tempfile
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mamba2_guard.core.results import BenchResult, CaseResult, HistoryPoint
from mamba2_guard.core.verdicts import PRECISION_FAIL, Verdict, exit_code
from mamba2_kernels.files import new_file_mode

SCHEMA_VERSION = 1
RUN_STATUSES = ("pass", "fail", "error")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at TEXT NOT NULL,
    recorded_at TEXT NOT NULL,
    job TEXT NOT NULL,
    suite TEXT,
    fingerprint_hash TEXT NOT NULL,
    fingerprint_json TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pass', 'fail', 'error')),
    exit_code INTEGER NOT NULL,
    n_cases INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_job ON runs (job, id);
CREATE TABLE IF NOT EXISTS cases (
    run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    kernel TEXT NOT NULL,
    shape TEXT NOT NULL,
    phase TEXT,
    helion_median_ms REAL,
    mamba_ssm_median_ms REAL,
    speedup REAL,
    helion_p10_ms REAL,
    helion_p90_ms REAL,
    n_samples INTEGER,
    precision_ok INTEGER,
    mean_abs_diff_vs_mamba_ssm REAL,
    max_abs_diff_vs_mamba_ssm REAL,
    max_rel_err_vs_fp64 REAL,
    roofline_fraction REAL,
    throttled INTEGER NOT NULL,
    timings_meaningful INTEGER NOT NULL,
    missing INTEGER NOT NULL,
    error TEXT,
    status TEXT,
    signal TEXT,
    effect REAL,
    p_value REAL,
    confirmed INTEGER,
    PRIMARY KEY (run_id, kernel, shape)
);
CREATE INDEX IF NOT EXISTS cases_case ON cases (kernel, shape, run_id);
"""


class HistoryError(RuntimeError):
    """The history cannot be used (locked, unreadable, written by a newer version)."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"run history {self.path}: {reason}")


class HistoryCorrupt(HistoryError):
    """The history file is damaged or is not a mamba2-guard SQLite database."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        super().__init__(path, f"corrupt ({reason}); move it aside to start a new history")


def _iso(now: datetime) -> str:
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)  # naive means UTC here
    return now.astimezone(timezone.utc).isoformat()


def _precision_ok(case: CaseResult, verdict: Verdict | None) -> int | None:
    p = case.precision
    if p is None:
        return None
    bad = p.finite is False or p.allclose is False or p.ok is False
    if verdict is not None and verdict.status == PRECISION_FAIL:
        bad = True
    return 0 if bad else 1


class History:
    """The run history at ``path`` (created when missing)."""

    def __init__(self, path: str | os.PathLike[str], *, check: bool = True, timeout: float = 30.0):
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        if self.path.exists() and self.path.is_dir():
            raise HistoryError(self.path, "is a directory")
        if self.path.exists() and self.path.stat().st_size == 0:  # SQLite would take it for a new database
            raise HistoryCorrupt(self.path, "empty file, truncated")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            self._create()
        try:
            conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(self.path, f"cannot open: {exc}") from exc
        self._conn = conn
        try:
            with self._errors():
                if check:
                    rows = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
                    if rows != ["ok"]:
                        raise HistoryCorrupt(self.path, "; ".join(str(r) for r in rows[:3]))
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA foreign_keys=ON")
                self._migrate()
        except BaseException:
            conn.close()
            self._conn = None
            raise

    def _create(self) -> None:
        """A new history, made aside and linked into place: SQLite creates an empty file first, and a kill or a
        full disk before it wrote the header would leave that file, which reads as a truncated history."""
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            os.fchmod(fd, new_file_mode())  # as SQLite would create it, not owner-only: others may read it
            os.close(fd)
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("PRAGMA user_version=0")  # writes the header: a database, not an empty file
            finally:
                conn.close()
            with contextlib.suppress(FileExistsError):  # another process created it meanwhile: theirs stands
                os.link(tmp, self.path)
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(self.path, f"cannot create: {getattr(exc, 'strerror', None) or exc}") from exc
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    # -- plumbing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """sqlite errors as HistoryError / HistoryCorrupt naming the file."""
        try:
            yield
        except HistoryError:
            raise
        except sqlite3.OperationalError as exc:
            raise HistoryError(self.path, str(exc)) from exc
        except sqlite3.DatabaseError as exc:  # "file is not a database", "disk image is malformed"
            raise HistoryCorrupt(self.path, str(exc)) from exc

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise HistoryError(self.path, "closed")
        return self._conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self.conn
        with self._errors():
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _migrate(self) -> None:
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(self.path, f"schema version {version} is newer than this build's {SCHEMA_VERSION}")
        if version == SCHEMA_VERSION:
            return
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        foreign = tables - {"runs", "cases", "sqlite_sequence"}
        if version == 0 and foreign:
            raise HistoryCorrupt(self.path, f"not a mamba2-guard history (tables {sorted(foreign)})")
        with self._transaction() as conn:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------

    def _insert_run(self, conn: sqlite3.Connection, result: BenchResult, now: datetime, job: str,
                    status: str, code: int) -> int:
        cur = conn.execute(
            "INSERT INTO runs (started_at, recorded_at, job, suite, fingerprint_hash, fingerprint_json, status,"
            " exit_code, n_cases) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (result.started_at or _iso(now), _iso(now), job, result.suite, result.fingerprint_hash,
             json.dumps(result.fingerprint, sort_keys=True, default=str), status, code, len(result.cases)),
        )
        return int(cur.lastrowid)  # type: ignore[arg-type]

    def _insert_case(self, conn: sqlite3.Connection, run_id: int, case: CaseResult, verdict: Verdict | None) -> None:
        h = case.summary("helion")
        p = case.precision
        conn.execute(
            "INSERT INTO cases (run_id, kernel, shape, phase, helion_median_ms, mamba_ssm_median_ms, speedup,"
            " helion_p10_ms, helion_p90_ms, n_samples, precision_ok, mean_abs_diff_vs_mamba_ssm,"
            " max_abs_diff_vs_mamba_ssm, max_rel_err_vs_fp64, roofline_fraction, throttled, timings_meaningful,"
            " missing, error, status, signal, effect, p_value, confirmed)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id, case.kernel, case.shape, case.phase,
                h.median if h else None, case.mamba_ssm_median_ms, case.speedup,
                h.p10 if h else None, h.p90 if h else None, h.n if h else 0,
                _precision_ok(case, verdict),
                p.mean_abs_diff_vs_mamba_ssm if p else None, p.max_abs_diff_vs_mamba_ssm if p else None,
                p.max_rel_err_vs_fp64 if p else None, case.roofline_fraction,
                int(case.throttled), int(case.timings_meaningful), int(case.missing), case.error,
                verdict.status if verdict else None, verdict.signal if verdict else None,
                verdict.effect if verdict else None, verdict.p_value if verdict else None,
                None if verdict is None else int(verdict.confirmed),
            ),
        )

    def record(self, result: BenchResult, verdicts: Sequence[Verdict], now: datetime, *,
               job: str = "nightly", status: str | None = None) -> int:
        """Store one run (all its cases and verdicts) atomically; returns its run id.

        ``status`` defaults to "pass" / "fail" from the verdicts' exit code; pass "error" for a
        run that hit an environment error (exit code 2).
        """
        code = exit_code(verdicts)
        if status is None:
            status = "pass" if code == 0 else "fail"
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
        if status == "error":
            code = 2
        by_key = {(v.kernel, v.shape): v for v in verdicts}
        with self._transaction() as conn:
            run_id = self._insert_run(conn, result, now, job, status, code)
            for case in result.cases:
                self._insert_case(conn, run_id, case, by_key.get(case.key))
        return run_id

    # -- reading -------------------------------------------------------------------------------

    def run_of(self, result: BenchResult) -> int | None:
        """The run recorded for ``result`` (the same start, to the second, fingerprint, suite and number of
        cases), or None: a result checked again is not recorded again, which would count one measurement twice
        in every later window."""
        with self._errors():
            row = self.conn.execute(
                "SELECT MIN(id) FROM runs WHERE started_at = ? AND fingerprint_hash = ? AND suite IS ? AND n_cases = ?",
                (result.started_at, result.fingerprint_hash, result.suite, len(result.cases))).fetchone()
        return row[0] if row and row[0] is not None else None

    def window(self, kernel: str, shape: str, fingerprint_hash: str, size: int = 20, *,
               before_run: int | None = None) -> list[HistoryPoint]:
        """Up to ``size`` earlier runs of one case, oldest first, all since the last run recorded
        under a different fingerprint (any job). Throttled, errored, missing and interpret-mode
        cases are left out. ``before_run`` excludes that run and later ones (the current run)."""
        if size <= 0:
            return []
        before = before_run if before_run is not None else -1
        with self._errors():
            reset = self.conn.execute(
                "SELECT COALESCE(MAX(id), 0) FROM runs WHERE fingerprint_hash != ? AND (? < 0 OR id < ?)",
                (fingerprint_hash, before, before),
            ).fetchone()[0]
            rows = self.conn.execute(
                "SELECT r.id, r.started_at, r.fingerprint_hash, c.helion_median_ms, c.mamba_ssm_median_ms,"
                " c.speedup FROM cases c JOIN runs r ON r.id = c.run_id"
                " WHERE c.kernel = ? AND c.shape = ? AND r.fingerprint_hash = ? AND r.id > ?"
                " AND (? < 0 OR r.id < ?) AND c.throttled = 0 AND c.timings_meaningful = 1 AND c.missing = 0"
                " AND c.error IS NULL AND c.helion_median_ms IS NOT NULL"
                " ORDER BY r.id DESC LIMIT ?",
                (kernel, shape, fingerprint_hash, reset, before, before, size),
            ).fetchall()
        return [HistoryPoint(*r) for r in reversed(rows)]

    def last_success(self, job: str, *, passing: bool = False) -> datetime | None:
        """When the last run of ``job`` that completed (status pass or fail; with ``passing``, pass
        only) was recorded; None when there is none."""
        statuses = ("pass",) if passing else ("pass", "fail")
        marks = ",".join("?" * len(statuses))
        with self._errors():
            row = self.conn.execute(
                f"SELECT recorded_at FROM runs WHERE job = ? AND status IN ({marks}) ORDER BY id DESC LIMIT 1",
                (job, *statuses),
            ).fetchone()
        return datetime.fromisoformat(row[0]) if row else None

    def runs(self, limit: int = 20, job: str | None = None) -> list[dict[str, Any]]:
        """The latest runs, newest first, as dicts (without the fingerprint JSON)."""
        with self._errors():
            cur = self.conn.execute(
                "SELECT id, started_at, recorded_at, job, suite, fingerprint_hash, status, exit_code, n_cases"
                " FROM runs WHERE (? IS NULL OR job = ?) ORDER BY id DESC LIMIT ?",
                (job, job, limit),
            )
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def cases(self, run_id: int) -> list[dict[str, Any]]:
        """The stored rows of one run's cases."""
        with self._errors():
            cur = self.conn.execute("SELECT * FROM cases WHERE run_id = ? ORDER BY kernel, shape", (run_id,))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
