"""Files: guard's one atomic write, its stale temp files, a writability check, and the tail of a log.

``kernels/config_store.py`` keeps its own ``atomic_write_text`` for the kernels package (kernels never
import guard); everything under ``guard/`` writes through :func:`atomic_write` here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

STALE_TEMP_S = 600.0  # a temp file of an atomic write this old belongs to a writer that was killed


def atomic_write(path: Path, data: str | bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` so that a kill at any moment leaves the old file or the new one.

    A temp file in the same folder is written, fsynced (and given ``mode``, if any), renamed over
    ``path``; the folder is fsynced after the rename. Text is written as UTF-8.
    """
    path = Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else bytes(data)
    handle = tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".tmp", delete=False)  # noqa: SIM115
    tmp_name = handle.name
    try:
        with handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
            if mode is not None:
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


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write` for text (the signature of ``kernels.config_store.atomic_write_text``)."""
    atomic_write(path, text)


def clean_stale_temp_files(folder: Path, *, recursive: bool = True, older_than_s: float = STALE_TEMP_S) -> list[Path]:
    """Remove the temp files (``.<name>.<random>.tmp``) that killed atomic writes left in ``folder``.

    Only those older than ``older_than_s``: a younger one may be a live writer's (the daemon's state file
    while a CLI cycle starts). Returns what was removed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    now = time.time()
    removed = []
    for path in (folder.rglob if recursive else folder.glob)(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if path.is_file() and now - path.stat().st_mtime > older_than_s:
                path.unlink()
                removed.append(path)
    return removed


def check_writable(folder: Path) -> Path:
    """Create ``folder`` and prove that a file can be written in it; an OSError naming the path if not."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
        pass
    return folder


def tail(path: Path, lines: int = 1) -> str:
    """The last ``lines`` lines of a log, joined with `` | `` and cut to 300 characters ("" if unreadable)."""
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-300:]
