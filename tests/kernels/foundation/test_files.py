"""The ground floor of both packages: atomic writes that keep the modes other users need, the state directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mamba2_kernels import config_store, files
from mamba2_kernels.config_store import ConfigFile


def test_a_saved_file_keeps_the_read_bits_other_users_need(tmp_path):
    """Training jobs and the guard may run as other users: a file written atomically gets the
    mode the replaced file had, or a new file's under the umask, never the owner-only mode of a temp file."""
    def mode(path):
        return stat.S_IMODE(path.stat().st_mode)

    before = os.umask(0o022)
    try:
        config_store.save(tmp_path / "new.yaml", ConfigFile())
        assert mode(tmp_path / "new.yaml") == 0o644
        os.umask(0o027)
        config_store.save(tmp_path / "group.yaml", ConfigFile())
        assert mode(tmp_path / "group.yaml") == 0o640
        kept = tmp_path / "kept.yaml"
        kept.write_text("")
        kept.chmod(0o604)
        config_store.save(kept, ConfigFile())
        assert mode(kept) == 0o604
        files.atomic_write(kept, "x", mode=0o700)
        assert mode(kept) == 0o700
    finally:
        os.umask(before)


def test_the_state_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MAMBA2_GUARD_STATE", str(tmp_path / "here"))
    assert files.state_dir() == tmp_path / "here"
    monkeypatch.delenv("MAMBA2_GUARD_STATE")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert files.state_dir() == tmp_path / "xdg" / "mamba2-guard"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert files.state_dir() == Path.home() / ".local" / "state" / "mamba2-guard"
