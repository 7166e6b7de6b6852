"""mamba2_guard.adapters.history: SQLite run history, windows with fingerprint resets, crash safety, corruption."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from mamba2_guard.adapters.history import History, HistoryCorrupt, HistoryError
from mamba2_guard.core.results import BenchResult
from mamba2_guard.core.verdicts import Policy, check

from .factories import FINGERPRINT, baseline_of, make_case

T0 = datetime(2026, 9, 1, 3, 0, tzinfo=timezone.utc)
REPO = Path(__file__).resolve().parents[3]


def _result(rng, fp=None, n_kernels=3, **kw):
    cases = tuple(make_case(rng, kernel=f"k{i}", n=10, **kw) for i in range(n_kernels))
    return BenchResult(dict(fp or FINGERPRINT), cases, suite="nightly")


@pytest.fixture
def hist(tmp_path):
    with History(tmp_path / "state" / "history.sqlite") as h:
        yield h


def test_record_and_window(hist):
    rng = np.random.default_rng(0)
    ids = []
    for night in range(5):
        r = _result(rng, mamba_ms=1.3 + 0.01 * night)
        ids.append(hist.record(r, check(r, None), T0 + timedelta(days=night)))
    fp = _result(rng).fingerprint_hash
    w = hist.window("k0", "s", fp, size=3)
    assert [p.run_id for p in w] == ids[-3:]  # oldest first, the latest three
    assert w[-1].speedup == pytest.approx(1.34, rel=0.02)
    assert w[0].helion_median_ms == pytest.approx(1.0, rel=0.02)
    assert [p.run_id for p in hist.window("k0", "s", fp, size=10, before_run=ids[-1])] == ids[:-1]
    assert hist.window("nope", "s", fp) == []
    assert hist.runs(limit=2)[0]["id"] == ids[-1]
    rows = hist.cases(ids[0])
    assert len(rows) == 3 and rows[0]["status"] == "no-baseline" and rows[0]["precision_ok"] == 1


def test_window_resets_on_fingerprint_change(hist):
    rng = np.random.default_rng(1)
    fp_a, fp_b = FINGERPRINT, {**FINGERPRINT, "driver_version": "590.0"}
    seq = [fp_a, fp_a, fp_a, fp_b, fp_b, fp_a]
    ids = [hist.record(r, [], T0 + timedelta(days=i)) for i, r in enumerate(_result(rng, fp) for fp in seq)]
    h_a, h_b = (BenchResult(dict(f), ()).fingerprint_hash for f in (fp_a, fp_b))
    # back on A after B: only the run since the change counts
    assert [p.run_id for p in hist.window("k0", "s", h_a)] == [ids[5]]
    # as of before the last run, B's window was its two runs
    assert [p.run_id for p in hist.window("k0", "s", h_b, before_run=ids[5])] == ids[3:5]
    # a fingerprint never seen (new environment): empty window
    assert hist.window("k0", "s", "0" * 64) == []


def test_window_skips_unusable_cases(hist):
    rng = np.random.default_rng(2)
    fp = _result(rng).fingerprint_hash
    good = hist.record(_result(rng), [], T0)
    for kw in ({"throttled": True}, {"error": "boom"}, {"timings_meaningful": False}, {"missing": True}):
        hist.record(_result(rng, **kw), [], T0)
    assert [p.run_id for p in hist.window("k0", "s", fp)] == [good]


def test_last_success(hist):
    rng = np.random.default_rng(3)
    assert hist.last_success("nightly") is None
    r = _result(rng)
    hist.record(r, check(r, None), T0, job="nightly")
    regressed = _result(rng, helion_shift=1.5)
    vs = check(regressed, baseline_of(*r.cases))
    assert {v.status for v in vs} == {"regression"}
    hist.record(regressed, vs, T0 + timedelta(days=1), job="nightly")
    hist.record(r, [], T0 + timedelta(days=2), job="nightly", status="error")
    hist.record(r, [], T0 + timedelta(days=3), job="autotune")
    assert hist.last_success("nightly") == T0 + timedelta(days=1)  # completed, found a regression
    assert hist.last_success("nightly", passing=True) == T0
    assert hist.last_success("autotune") == T0 + timedelta(days=3)
    with pytest.raises(ValueError):
        hist.record(r, [], T0, status="meh")


def test_naive_now_is_utc(hist):
    rng = np.random.default_rng(4)
    hist.record(_result(rng), [], datetime(2026, 9, 1, 3, 0), job="j")
    assert hist.last_success("j") == T0


def test_wal_and_reopen(tmp_path):
    path = tmp_path / "h.sqlite"
    rng = np.random.default_rng(5)
    with History(path) as h:
        h.record(_result(rng), [], T0)
        assert h.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with History(path) as h:
        assert len(h.runs()) == 1


def test_exception_mid_run_rolls_back(tmp_path):
    rng = np.random.default_rng(6)

    class Flaky(History):
        def _insert_case(self, conn, run_id, case, verdict):
            if case.kernel == "k2":
                raise RuntimeError("disk full")
            super()._insert_case(conn, run_id, case, verdict)

    with Flaky(tmp_path / "h.sqlite") as h:
        with pytest.raises(RuntimeError):
            h.record(_result(rng), [], T0)
        assert h.runs() == [] and h.conn.execute("SELECT COUNT(*) FROM cases").fetchone()[0] == 0
        h.record(_result(rng, n_kernels=2), [], T0)  # still usable
        assert len(h.runs()) == 1


def test_a_new_history_is_readable_as_the_umask_allows(tmp_path):
    """Made aside as a temp file (owner-only) and linked into place: it gets the mode SQLite would give it."""
    before = os.umask(0o022)
    try:
        with History(tmp_path / "h.sqlite"):
            pass
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "h.sqlite").stat().st_mode) == 0o644


def test_killed_mid_transaction_leaves_no_half_run(tmp_path):
    """A process killed (os._exit, no cleanup) after writing the run row and some cases."""
    path = tmp_path / "h.sqlite"
    rng = np.random.default_rng(7)
    with History(path) as h:
        h.record(_result(rng), [], T0)
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        sys.path.insert(0, {str(REPO / "tests" / "guard")!r})
        from datetime import datetime, timezone
        import numpy as np
        from mamba2_guard.adapters.history import History
        from core.test_history import _result

        class Dies(History):
            def _insert_case(self, conn, run_id, case, verdict):
                super()._insert_case(conn, run_id, case, verdict)
                if case.kernel == "k1":
                    os._exit(9)

        h = Dies({str(path)!r})
        h.record(_result(np.random.default_rng(8)), [], datetime(2026, 9, 2, tzinfo=timezone.utc))
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    with History(path) as h:  # integrity check passes on open
        assert len(h.runs()) == 1
        assert h.conn.execute("SELECT COUNT(*) FROM cases").fetchone()[0] == 3
        h.record(_result(rng), [], T0)
        assert len(h.runs()) == 2


def test_garbage_file_is_reported_as_corrupt(tmp_path):
    path = tmp_path / "history.sqlite"
    path.write_bytes(b"this is not sqlite at all\n" * 200)
    with pytest.raises(HistoryCorrupt) as info:
        History(path)
    assert str(path) in str(info.value) and "corrupt" in str(info.value)


def test_damaged_pages_are_reported_as_corrupt(tmp_path):
    path = tmp_path / "history.sqlite"
    rng = np.random.default_rng(9)
    with History(path) as h:
        for night in range(30):
            h.record(_result(rng, n_kernels=6), [], T0 + timedelta(days=night))
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 6 * page
    for off in range(2 * page, len(data) - page, 3 * page):  # scribble over every third page
        data[off + 8: off + 900] = b"\xa5" * 892
    path.write_bytes(bytes(data))
    with pytest.raises(HistoryCorrupt) as info:
        History(path)
    assert str(path) in str(info.value)


def test_foreign_database_and_newer_schema(tmp_path):
    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE users (id INTEGER)")
    conn.close()
    with pytest.raises(HistoryCorrupt, match="not a mamba2-guard history"):
        History(foreign)
    newer = tmp_path / "newer.sqlite"
    History(newer).close()
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(HistoryError, match="newer"):
        History(newer)


def test_directory_path_is_an_error(tmp_path):
    with pytest.raises(HistoryError, match="directory"):
        History(tmp_path)


def test_history_feeds_the_drift_rule(hist):
    """End to end: nightly runs drift slowly; the window from SQLite trips the history signal."""
    rng = np.random.default_rng(10)
    policy = Policy()
    fp = _result(rng, n_kernels=1).fingerprint_hash
    statuses = []
    for night in range(24):
        slow = 1 + 0.006 * max(0, night - 9)
        r = _result(rng, n_kernels=1, helion_shift=slow)
        baseline = baseline_of(*_result(rng, n_kernels=1, helion_shift=slow).cases)  # re-baselined nightly
        window = hist.window("k0", "s", fp, size=policy.history_size)
        vs = check(r, baseline, {("k0", "s"): window}, policy)
        statuses.append((vs[0].status, vs[0].signal))
        assert not vs[0].environment  # Helion-only drift is never blamed on the environment
        hist.record(r, vs, T0 + timedelta(days=night))
    first = next(i for i, s in enumerate(statuses) if s == ("regression", "history"))
    assert all(s[0] == "ok" for s in statuses[:first])
    assert first <= 21  # within ~12 nights of the start of the drift (cumulative ~7 %)
