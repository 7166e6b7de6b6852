"""Files: the stale temp files of atomic writes, a writability check, the tail of a log, and the checks of
command-line paths (argparse ``type=`` functions: a bad path is one line naming the flag, exit 2, before any work).

The one atomic write is ``mamba2_kernels.files.atomic_write``, the ground floor of both packages (kernels never
import mamba2_guard, so it lives there); everything writes through it.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

STALE_TEMP_S = 600.0  # a temp file of an atomic write this old belongs to a writer that was killed


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


def creatable_directory(text: str) -> str:
    """A directory path, or one that can be created: nothing on it is a file."""
    path = Path(text)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{existing} is not a directory")
    return text


def writable_directory(text: str) -> str:
    """A directory the command will write into, made now: a folder it cannot create or write is an error
    before any work (``nightly --out`` used to find it only after an hour of bench)."""
    creatable_directory(text)
    path = Path(text)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write into {text}: {exc.strerror or exc}") from None
    return text


def existing_directory(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"expected an existing directory, got {text!r}")
    return text


def creatable_file(text: str, expected: str = "a file path") -> str:
    """A file path to write: not a directory, and its folder exists or can be created. ``expected`` names
    what the flag takes, in the error."""
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; expected {expected}")
    creatable_directory(str(Path(text).parent))
    return text
