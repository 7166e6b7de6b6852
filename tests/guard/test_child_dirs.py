"""Temp dirs of child processes whose parent was killed are removed, and only those."""

from __future__ import annotations

import os
import subprocess

from mamba2_guard.adapters.processes import CHILD_DIR_PREFIX, remove_orphaned_child_dirs


def test_only_dirs_of_dead_parents_are_removed(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = tmp_path / f"{CHILD_DIR_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{CHILD_DIR_PREFIX}{os.getpid()}-xyz"
    other = tmp_path / "something-else"
    for folder in (orphan, live, other):
        folder.mkdir()
        (folder / "spec.pkl").write_bytes(b"")
    assert remove_orphaned_child_dirs(tmp_path) == [orphan]
    assert not orphan.exists() and live.exists() and other.exists()
