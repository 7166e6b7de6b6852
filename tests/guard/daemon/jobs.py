"""Stand-in job functions for the daemon tests (module-level, so the job store and children load them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _mark(state_dir: Path, name: str, **data) -> None:
    marks = Path(state_dir) / "marks"
    marks.mkdir(exist_ok=True)
    (marks / f"{name}-{time.time_ns()}.json").write_text(json.dumps({"pid": os.getpid(), **data}))


def marks(state_dir: Path, name: str) -> list[dict]:
    folder = Path(state_dir) / "marks"
    return [json.loads(p.read_text()) for p in sorted(folder.glob(f"{name}-*.json"))] if folder.exists() else []


def fake_cycle(state_dir: Path, sleep_s: float = 0.0, exit_code: int = 0, snapshot: bool = True,
               grandchild: bool = False, **options) -> int:
    """What run_cycle does, minus the GPU: writes latest.json; can sleep (a hung GPU) and spawn a worker."""
    _mark(state_dir, "cycle-start", options=options)
    if grandchild:  # like Helion's autotune workers: must die with the cycle
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (Path(state_dir) / "grandchild.pid").write_text(str(proc.pid))
    if sleep_s:
        time.sleep(sleep_s)
    if snapshot:
        from mamba2_guard.adapters.metrics import write_snapshot
        from tests.guard import sample

        s = sample.snapshot()
        write_snapshot(Path(state_dir), s["result"], s["verdicts"], drift=s["drift"], events=s["events"])
    _mark(state_dir, "cycle-end", options=options)
    return exit_code


def raises(state_dir: Path, **_) -> int:
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def returns(value):
    return {"value": value, "pid": os.getpid()}


def probe_no_drift(state_dir: Path) -> dict:
    from tests.guard import sample

    return {"fingerprint": sample.FINGERPRINT, "drift": {"found": False, "action": "ignore", "items": []}}


def probe_drift(state_dir: Path) -> dict:
    from tests.guard import sample

    return {"fingerprint": sample.FINGERPRINT, "drift": sample.drift()}


def busy_cycle(state_dir, **_):
    """A daemon_cycle that found another cycle holding the state dir."""
    from mamba2_guard import EXIT_BUSY

    return EXIT_BUSY
