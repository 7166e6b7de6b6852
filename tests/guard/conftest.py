"""Fixtures of the guard's tests. The PR path's (adapters/test_gitops, adapters/test_github, flows/test_pr...): a real
bare origin (file://), source dirs, a fake GitHub on 127.0.0.1, the token. The processes' (daemon/, adapters/
test_metrics...): real Prometheus, Pushgateway and daemon processes on 127.0.0.1 (``tests.guard.live``)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `from tests.guard import ...` under any pytest import mode
    sys.path.insert(0, str(REPO))

from tests.guard.fake_github import FakeGitHub  # noqa: E402
from tests.guard.live import Daemon, Prometheus, binary, free_port, http_get, stop, wait_for  # noqa: E402
from tests.guard.pr_data import CONFIGS_OLD, FP_OLD, TOKEN, baseline_doc, dump, git  # noqa: E402


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    return TOKEN


@pytest.fixture
def origin(tmp_path) -> Path:
    """A bare repo with main holding configs + baselines for h200 (and a100, untouched by the bot)."""
    bare = tmp_path / "origin.git"
    git(tmp_path, "init", "--bare", "--initial-branch=main", str(bare))
    seed = tmp_path / "seed"
    git(tmp_path, "init", "--initial-branch=main", str(seed))
    dump(seed / "mamba2_kernels/configs/h200.yaml", CONFIGS_OLD)
    dump(seed / "mamba2_kernels/configs/a100.yaml", {"fingerprint": {"gpu_name": "A100"}, "kernels": {}})
    dump(seed / "baselines/h200.yaml", baseline_doc(FP_OLD))
    (seed / "README.md").write_text("configs\n")
    git(seed, "add", "-A")
    git(seed, "commit", "-q", "-m", "initial")
    git(seed, "remote", "add", "origin", str(bare))
    git(seed, "push", "-q", "origin", "main")
    return bare


@pytest.fixture
def origin_url(origin) -> str:
    return f"file://{origin}"


@pytest.fixture
def make_source(tmp_path):
    counter = iter(range(1000))

    def _make(configs=None, baseline=None) -> Path:
        src = tmp_path / f"source{next(counter)}"
        if configs is not None:
            dump(src / "mamba2_kernels/configs/h200.yaml", configs)
        if baseline is not None:
            dump(src / "baselines/h200.yaml", baseline)
        # Files the bot must never commit.
        dump(src / "mamba2_kernels/configs/a100.yaml", {"fingerprint": {"gpu_name": "A100"}, "kernels": {"x": {}}})
        (src / "junk.txt").parent.mkdir(parents=True, exist_ok=True)
        (src / "junk.txt").write_text("not for the bot\n")
        return src

    return _make


@pytest.fixture
def fake_gh(token):
    with FakeGitHub(token) as server:
        yield server
    assert server.violations == [], server.violations


@pytest.fixture
def client(fake_gh):
    from mamba2_guard.adapters.github import PrClient

    return PrClient(
        base_url=fake_gh.api, retry=None, seconds_between_requests=None, seconds_between_writes=None, timeout=10
    )


@pytest.fixture
def debug_logs(caplog):
    caplog.set_level(logging.DEBUG)
    return caplog


@pytest.fixture
def start_prometheus(tmp_path):
    """start_prometheus(targets, honor_labels=False) -> Prometheus scraping them every second."""
    exe = binary("prometheus")
    procs = []

    def start(targets: list[str], honor_labels: bool = False) -> Prometheus:
        port = free_port()
        config = tmp_path / f"prometheus-{port}.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: guard\n    honor_labels: {str(honor_labels).lower()}\n"
            f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
        )
        log = open(tmp_path / f"prometheus-{port}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / f'tsdb-{port}'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append((proc, log))
        prom = Prometheus(f"http://127.0.0.1:{port}")
        wait_for(lambda: http_get(f"{prom.url}/-/ready"), 20, what="prometheus ready")
        return prom

    yield start
    for proc, log in procs:
        stop(proc, log)


@pytest.fixture
def pushgateway(tmp_path):
    exe = binary("prometheus-pushgateway")
    port = free_port()
    log = open(tmp_path / "pushgateway.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(f"{url}/-/ready"), 20, what="pushgateway ready")
        yield url
    finally:
        stop(proc, log)


@pytest.fixture
def start_daemon(tmp_path):
    daemons: list[Daemon] = []

    def start(state: Path, *args: str, quiet: bool = True) -> Daemon:
        base = ["--metrics-port", "0", "--drift-interval", "3600",
                "--drift-target", "tests.guard.daemon.jobs:probe_no_drift"]
        d = Daemon(state, base + list(args), tmp_path / f"daemon-{len(daemons)}.log")
        daemons.append(d)
        return d

    yield start
    for d in daemons:
        if d.proc.poll() is None:
            os.killpg(d.proc.pid, signal.SIGKILL)
            d.proc.wait(10)


@pytest.fixture(scope="session", autouse=True)
def _no_child_dirs_left_behind():
    """Daemons these tests kill with SIGKILL leave their children's temp dirs: remove them at the end."""
    yield
    from mamba2_guard.adapters.processes import remove_orphaned_child_dirs

    remove_orphaned_child_dirs()
