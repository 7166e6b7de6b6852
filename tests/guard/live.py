"""Real parts for the tests that run processes: free ports, Prometheus and Pushgateway processes, daemon processes
(the fixtures are conftest.py's)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
APT_LINE = "apt-get install -y prometheus prometheus-pushgateway"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} binary not found (Debian: {APT_LINE})")
    return path


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (127.0.0.1 only)
        return resp.read()


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last error: {last_exc!r})")


def stop(proc: subprocess.Popen, log) -> None:
    """End a server process started by a fixture (SIGTERM, then SIGKILL after 10 s) and close its log."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str) -> list:
        data = json.loads(http_get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
        assert data["status"] == "success", data
        return data["data"]["result"]

    def series(self, match: str) -> list:
        data = json.loads(http_get(f"{self.url}/api/v1/series?" + urllib.parse.urlencode({"match[]": match})))
        return data["data"]


class Daemon:
    """A ``mamba2-guard daemon`` in a subprocess, with stand-in jobs from tests.guard.daemon.jobs."""

    def __init__(self, state: Path, args: list[str], log: Path):
        self.state, self.log_path = state, log
        self._log = open(log, "ab")  # noqa: SIM115
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c",
             "import sys; from mamba2_guard.cli import main; sys.exit(main(['daemon', *sys.argv[1:]]))",
             "--state-dir", str(state), *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_started(self, timeout: float = 20) -> None:
        wait_for(lambda: "mamba2-guard daemon: state" in self.output() or self.proc.poll() is not None, timeout,
                 what="daemon start")
        assert self.proc.poll() is None, self.output()

    def state_data(self) -> dict:
        path = self.state / "daemon-state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def count(self, job: str, status: str) -> int:
        return self.state_data().get("counts", {}).get(f"{job}/{status}", 0)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # A daemon that outlives its stop: what it said is the only clue (it found the lost-signal bug).
            pytest.fail(f"daemon still running {timeout:.0f} s after signal {sig}; its output:\n"
                        f"{self.output()[-6000:]}")
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
