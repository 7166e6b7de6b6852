"""The ground floor: files and the state directory, for both packages.

Everything that writes a file another process reads (configs, baselines, the seen-keys record, the guard's
state and reports) writes it through ``atomic_write``; ``state_dir`` is where the guard and the training jobs
of one machine meet. Nothing here imports anything of the project.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The largest state or input file the guard reads (seen keys, snapshots, results): far above what they hold,
# far below what would exhaust memory.
MAX_READ_BYTES = 64 * 1024 * 1024


class UnreadableFile(ValueError):
    """A file that is not a regular file, is larger than expected, or is nested too deeply to parse."""


def read_regular(path: Path, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes: a FIFO would block the reader
    forever and a link to /dev/zero never end. FileNotFoundError passes through; UnreadableFile names the
    file otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(f"{path}: not a regular file")
        if info.st_size > limit:
            raise UnreadableFile(f"{path}: {info.st_size} bytes, over the {limit} a file of this kind can hold")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnreadableFile(f"{path}: over the {limit} bytes a file of this kind can hold")
    return data


def load_yaml(path: Path, limit: int = MAX_READ_BYTES) -> Any:
    """``read_regular`` then ``yaml.safe_load`` (``parse_regular``). yaml.YAMLError and UnicodeDecodeError pass
    through for the caller to name."""
    import yaml

    return parse_regular(path, lambda data: yaml.safe_load(data.decode()), limit)


def load_json(path: Path, limit: int = MAX_READ_BYTES) -> Any:
    """``read_regular`` then JSON (``parse_regular``). json.JSONDecodeError and UnicodeDecodeError pass through
    for the caller to name."""
    return parse_regular(path, json.loads, limit)


def parse_regular(path: Path, parse: Callable[[bytes], Any], limit: int = MAX_READ_BYTES) -> Any:
    """``parse`` of ``read_regular``'s bytes; nesting too deep for the parser is an UnreadableFile naming the
    file, not a RecursionError."""
    data = read_regular(path, limit)
    try:
        return parse(data)
    except RecursionError:
        raise UnreadableFile(f"{path}: nested too deeply to be a file the guard writes") from None


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
