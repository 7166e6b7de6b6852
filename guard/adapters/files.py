"""Files: guard's one atomic write, and the tail of a log.

``kernels/config_store.py`` keeps its own ``atomic_write_text`` for the kernels package (kernels never
import guard); everything under ``guard/`` writes through :func:`atomic_write` here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


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
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    folder_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(folder_fd)
    finally:
        os.close(folder_fd)


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write` for text (the signature of ``kernels.config_store.atomic_write_text``)."""
    atomic_write(path, text)


def tail(path: Path, lines: int = 1) -> str:
    """The last ``lines`` lines of a log, joined with `` | `` and cut to 300 characters ("" if unreadable)."""
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-300:]
