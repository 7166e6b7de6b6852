"""Fixtures of the PR path's tests (adapters/test_gitops, adapters/test_github, flows/test_pr...): a real bare
origin (file://), source dirs, a fake GitHub on 127.0.0.1, the token."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `from tests.guard import ...` under any pytest import mode
    sys.path.insert(0, str(REPO))

from tests.guard.fake_github import FakeGitHub  # noqa: E402
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
