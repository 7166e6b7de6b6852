"""Crash safety of the real nightly cycle: kill -9 in the middle, then restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mamba2_guard.adapters.history import History

KERNELS = ["chunk_cumsum", "bmm_chunk", "chunk_state", "state_passing", "chunk_scan", "gated_rmsnorm_fwd"]


def _nightly(state: Path, *kernels: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mamba2_guard", "nightly", "--state-dir", str(state), "--shapes", "smoke", "--kernels",
         *kernels], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _leftover_temp_files(state: Path) -> list[Path]:
    return [p for p in state.rglob("*") if p.name.endswith(".tmp")]


def test_kill_9_mid_nightly_leaves_consistent_state_and_the_next_cycle_runs(tmp_path):
    state = tmp_path / "state"
    first = _nightly(state, "chunk_cumsum")
    assert first.wait(timeout=300) == 0, first.stdout.read()

    victim = _nightly(state, *KERNELS)
    seen = []
    deadline = time.monotonic() + 300
    for line in victim.stdout:  # kill it once the bench is under way, between two kernels
        seen.append(line)
        if line.startswith("[2/"):
            os.killpg(victim.pid, signal.SIGKILL)
            break
        assert time.monotonic() < deadline, "".join(seen)
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL, "".join(seen)

    with History(state / "history.sqlite") as history:  # opens with PRAGMA integrity_check
        assert [r["status"] for r in history.runs()] == ["pass"]  # no half-recorded run
    assert not _leftover_temp_files(state)
    json.loads((state / "latest.json").read_text())  # the previous snapshot, whole

    again = _nightly(state, "chunk_cumsum", "bmm_chunk")  # the lock of the killed cycle is gone
    output = again.communicate(timeout=300)[0]
    assert again.returncode == 0, output
    with History(state / "history.sqlite") as history:
        assert [r["n_cases"] for r in history.runs()] == [2, 1]
    assert not _leftover_temp_files(state)


# Nightlies that kill themselves (SIGKILL) at their n-th file replacement: after an atomic write's temp file
# is written and fsynced, before its rename. Renames are how every file of a cycle lands (result, reports,
# snapshot, metrics textfile), so n = 1, 2, ... kills one during each of its writes in turn. Each n read on
# stdin forks a cycle from this process, which imported the guard and torch once (they start no thread), and
# answers its exit code once it is dead: the cycles no longer pay an import each.
KILL_AT_WRITE = """
import os, signal, sys
import torch, helion, mamba2_kernels.ssd.combined, mamba2_guard.flows.nightly, mamba2_guard.bench.run
from mamba2_guard.cli import main
for line in sys.stdin:
    n, calls = int(line), [0]
    pid = os.fork()
    if pid == 0:
        log = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        def dying(real):
            def rename(*args, **kwargs):
                calls[0] += 1
                if calls[0] == n:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)
            return rename
        os.replace, os.rename = dying(os.replace), dying(os.rename)
        try:
            code = main(sys.argv[2:])
        except SystemExit as exc:
            code = exc.code
        os._exit(code or 0)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def test_kill_9_during_each_write_leaves_whole_files_and_the_next_cycle_cleans_up(tmp_path):
    from mamba2_guard.adapters.files import STALE_TEMP_S

    state, log = tmp_path / "state", tmp_path / "cycles.log"
    args = ["nightly", "--state-dir", str(state), "--shapes", "smoke", "--kernels", "chunk_cumsum"]
    cycles = subprocess.Popen([sys.executable, "-c", KILL_AT_WRITE, str(log), *args], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def cycle(n: int) -> int:
        cycles.stdin.write(f"{n}\n")
        cycles.stdin.flush()
        return int(cycles.stdout.readline())

    try:
        for n in range(0, 6):  # 0: a whole cycle first, to be killed over
            assert cycle(n) == (-signal.SIGKILL if n else 0), f"write {n}: {log.read_text()}"
            json.loads((state / "latest.json").read_text())  # the old snapshot or the new one, never torn
            for path in (state / "reports").glob("*.json"):
                json.loads(path.read_text())
            with History(state / "history.sqlite") as history:  # opens with PRAGMA integrity_check
                assert {r["status"] for r in history.runs()} == {"pass"}
        leftovers = _leftover_temp_files(state)
        assert leftovers  # the killed writes' temp files, never renamed
        long_ago = time.time() - STALE_TEMP_S - 60
        for path in leftovers:  # found by a cycle that starts later
            os.utime(path, (long_ago, long_ago))
        assert cycle(0) == 0, log.read_text()
    finally:
        cycles.stdin.close()
        cycles.wait(timeout=60)
    assert not _leftover_temp_files(state)
