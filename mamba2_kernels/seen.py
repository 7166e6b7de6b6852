"""The shape keys a GPU served without their own tuned config, kept where the guard can tune them.

A training job never autotunes. When a kernel's call falls back (to a related key's config or to Helion's
default), the config store logs it once per process and calls ``record``, which merges one entry into a
small JSON file (``$MAMBA2_GUARD_SEEN``, else ``<state dir>/seen.json``; ``off`` turns it off):

    {"nvidia-h200|chunk_scan|D=h,...,z=1": {"gpu": "nvidia-h200", "kernel": "chunk_scan", "key": "...",
      "reason": "related", "used": "<the key whose config served>", "call": {<the public call's shape>},
      "first_seen": ..., "last_seen": ..., "processes": 3}}

``call`` is the shape of the public call that launched the kernel (``calling``), so that ``mamba2-guard
autotune --seen`` can tune the whole call at that shape. A write costs one file lock and one atomic
rename per new key per process; a file that cannot be written is logged, never fatal to the job. CPU runs
(tests, interpret mode) are not recorded.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mamba2_kernels.files import UnreadableFile, atomic_write, load_json, state_dir

log = logging.getLogger(__name__)

SEEN_ENV = "MAMBA2_GUARD_SEEN"
RECORD_ENV = "MAMBA2_GUARD_SEEN_RECORD"  # "0": a process of the guard itself (``stop_recording``)
MAX_ENTRIES = 1000  # the oldest by last_seen go first: the file stays small whatever a job does
_call: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("mamba2_guard_call", default=None)


def path() -> Path | None:
    """Where fallbacks are recorded, or None when ``$MAMBA2_GUARD_SEEN`` is ``off``."""
    override = os.environ.get(SEEN_ENV, "")
    if override.strip().lower() == "off":
        return None
    return Path(override) if override else state_dir() / "seen.json"


@contextlib.contextmanager
def calling(**shape: Any) -> Iterator[None]:
    """Inside the block, fallbacks are recorded with ``shape``: the public call's batch, seqlen, nheads,
    headdim, ngroups, dstate, chunk_size, dtype and call pattern (the fields of a suite shape)."""
    token = _call.set(shape)
    try:
        yield
    finally:
        _call.reset(token)


def current() -> dict[str, Any] | None:
    """The shape set by the innermost ``calling`` block (None outside one): autograd runs a backward outside
    the forward's block, so a Function keeps it for its backward."""
    return _call.get()


def read(file: Path) -> dict[str, dict[str, Any]]:
    """The entries of a seen file; a missing file is empty. Raises ValueError naming the file otherwise."""
    try:
        data = load_json(file)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, UnreadableFile) as exc:
        raise ValueError(f"{file}: not a readable seen-keys file ({exc})") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{file}: expected a mapping of '<gpu>|<kernel>|<key>' to entries")
    return data


def stop_recording() -> None:
    """No recording in this process and the processes it starts: the guard's own runs call shapes on purpose
    (a GPU nightly benches every zoo shape, held-out ones included; the tuner and the dev tools run grids),
    which is not what production hit. Recorded, they would have each nightly re-tune the held-out shapes."""
    os.environ[RECORD_ENV] = "0"


def record(kernel: str, key: str, gpu_slug: str, reason: str, used: str | None) -> None:
    """Merge one fallback into the seen file (see the module docstring); never raises."""
    file = path()
    if file is None or gpu_slug == "cpu" or os.environ.get(RECORD_ENV) == "0":
        return
    try:
        _merge(file, kernel, key, gpu_slug, reason, used)
    except Exception as exc:  # noqa: BLE001 (a training job must not fail for its bookkeeping)
        log.warning("could not record the fallback of %s at %s in %s: %s", kernel, key, file, exc)


def _merge(file: Path, kernel: str, key: str, gpu_slug: str, reason: str, used: str | None) -> None:
    from filelock import FileLock

    now = time.time()
    file.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(file) + ".lock", timeout=10):
        try:
            entries = read(file)
        except ValueError as exc:  # a broken file is replaced: it holds hints, not results
            log.warning("%s; starting it afresh", exc)
            entries = {}
        name = f"{gpu_slug}|{kernel}|{key}"
        entry = entries.get(name) or {"gpu": gpu_slug, "kernel": kernel, "key": key, "first_seen": now, "processes": 0}
        entry.update(reason=reason, used=used, last_seen=now, processes=int(entry.get("processes", 0)) + 1)
        call = _call.get()
        if call is not None:
            entry["call"] = call
        entries[name] = entry
        if len(entries) > MAX_ENTRIES:
            kept = sorted(entries.items(), key=lambda item: item[1].get("last_seen", 0))[-MAX_ENTRIES:]
            entries = dict(kept)
        atomic_write(file, json.dumps(entries, indent=1, sort_keys=True) + "\n")
