"""The ground floor: files and the state directory, for both packages.

Everything that writes a file another process reads (configs, baselines, the seen-keys record, the guard's
state and reports) writes it through ``atomic_write``; ``state_dir`` is where the guard and the training jobs
of one machine meet. Nothing here imports anything of the project.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def state_dir() -> Path:
    """``$MAMBA2_GUARD_STATE``, else ``$XDG_STATE_HOME/mamba2-guard`` (``~/.local/state/mamba2-guard``): the
    guard's state directory, shared with the training jobs of the same machine."""
    override = os.environ.get("MAMBA2_GUARD_STATE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "mamba2-guard"


def new_file_mode() -> int:
    """The mode ``open`` gives a new file under this process's umask (a temp file gets 0600 instead)."""
    return 0o666 & ~_process_umask()


def _process_umask() -> int:
    """Read without setting it where Linux allows: setting it, even back, races other threads' file creation."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o77)  # a file another thread makes meanwhile is at worst too private
    os.umask(umask)
    return umask


def atomic_write(path: Path, data: str | bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` so that a kill at any moment leaves the old file or the new one.

    A temp file in the same folder is written, fsynced, given ``mode`` (by default the replaced file's, or
    for a new file what ``open`` would give it under the umask), renamed over ``path``; the folder is fsynced
    after the rename. Text is written as UTF-8. The temp file alone would be owner-only: a config file, a
    baseline or a fallback record that other users' jobs and the guard read must keep their read bits.
    """
    path = Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else bytes(data)
    if mode is None:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = new_file_mode()
    handle = tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".tmp", delete=False)  # noqa: SIM115
    tmp_name = handle.name
    try:
        with handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp_name, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        if isinstance(exc, OSError) and exc.filename is None:  # a full disk: name the file
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    folder_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(folder_fd)
    finally:
        os.close(folder_fd)
