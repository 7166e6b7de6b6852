"""The PR flow's default remote survives a kill while it is first created."""

from __future__ import annotations

import subprocess

from mamba2_guard.flows.pr import default_origin


def _heads(bare) -> list[str]:
    out = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/heads"], cwd=bare,
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def test_a_bare_remote_left_without_its_base_branch_is_completed(tmp_path):
    bare = tmp_path / "state" / "pr" / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)  # killed right after `git init`
    assert _heads(bare) == []
    assert default_origin(tmp_path / "state", "main") == bare
    assert _heads(bare) == ["refs/heads/main"]
    head = subprocess.run(["git", "symbolic-ref", "HEAD"], cwd=bare, capture_output=True, text=True, check=True)
    assert head.stdout.strip() == "refs/heads/main"
    assert default_origin(tmp_path / "state", "main") == bare  # and again: nothing to do
