"""Child processes that may hang a GPU: the one place they are started, watched and killed.

Used by the daemon (:func:`run_in_child`: every scheduled GPU job), the autotuner
(``mamba2_guard.flows.autotune.TunerProcess``) and the sharded bench (``mamba2_guard.bench.shard``).

* :func:`spawn` starts a child in its own session (a new process group: pgid == pid), so the group, with
  whatever the child started (Helion's autotune workers, compiler processes), can be killed as one;
* :func:`watch_parent` runs in the child: if the parent dies (kill -9 included) it kills the child's
  whole process group, so no orphan holds the GPU;
* :func:`kill_group`: SIGTERM to the group, a grace, then SIGKILL to the group (grandchildren too, even
  if the leader already left) and a bounded wait (a process in uninterruptible sleep, a wedged driver,
  is abandoned with an error in the log rather than waited on forever);
* :func:`run_in_child`: a function call in a fresh Python process under a hard timeout, arguments and
  result travelling as pickles.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mamba2_kernels.files import atomic_write

log = logging.getLogger(__name__)


def spawn(cmd: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd, ...)`` in a new session: the child leads its own process group."""
    return subprocess.Popen(list(cmd), start_new_session=True, **popen_kwargs)


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the child's process group (to the child alone where the group is not ours)."""
    try:
        os.killpg(proc.pid, sig)  # the child is a session leader: pgid == pid
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0, *, reap_s: float = 10.0) -> bool:
    """SIGTERM the child's process group, wait ``grace_s``, SIGKILL the group, wait ``reap_s``.

    The SIGKILL goes to the group even when the leader left after the SIGTERM: its children may not
    have. Returns whether the child was reaped.
    """
    signal_group(proc, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    signal_group(proc, signal.SIGKILL)
    try:
        proc.wait(reap_s)
    except subprocess.TimeoutExpired:  # uninterruptible sleep (a wedged driver): stop waiting
        log.error("child %d did not die after SIGKILL (stuck in the kernel?); abandoning it", proc.pid)
        return False
    return True


def watch_parent(parent: int | None, interval_s: float = 0.5) -> None:
    """In a child: if ``parent`` is gone (this process re-parented), SIGKILL this whole process group.

    Checked every ``interval_s`` by a daemon thread; if the group cannot be signalled, the process exits 3.
    """
    if not parent:
        return

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def signal_name(rc: int) -> str:
    """How a child ended, from its return code: ``killed by SIGKILL`` or ``exit code 1``."""
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-rc).name}"
    return f"exit code {rc}"


# ----------------------------------------------------------------------------------------------
# A function call in a child process with a hard timeout (the daemon's GPU jobs)


@dataclass(frozen=True)
class ChildResult:
    status: str  # "ok" | "error" | "timeout" | "killed"
    value: Any = None  # the target's return value (status "ok")
    error: str | None = None  # traceback or reason
    returncode: int | None = None  # of the child process
    duration_s: float = 0.0
    pid: int | None = None
    log_path: str | None = None


CHILD_BOOT = "import sys; from mamba2_guard.adapters.processes import child_main; sys.exit(child_main(sys.argv[1]))"
_CHILDREN: dict[int, subprocess.Popen] = {}
_CHILDREN_LOCK = threading.Lock()


def target_ref(target: str | Callable[..., Any]) -> str:
    """``module:function`` for a module-level function (the only kind a child or job store can load)."""
    if isinstance(target, str):
        if ":" not in target:
            raise ValueError(f"target: expected 'module:function', got {target!r}")
        return target
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if not module or "<" in qualname or "." in qualname or module == "__main__":
        raise ValueError(f"target: {target!r} is not an importable module-level function")
    return f"{module}:{qualname}"


CHILD_DIR_PREFIX = "mamba2-guard-child-"  # then the parent's pid: see remove_orphaned_child_dirs


def remove_orphaned_child_dirs(root: Path | None = None) -> list[Path]:
    """Remove the temp dirs of :func:`run_in_child` whose parent process is gone: a parent killed with
    SIGKILL never ran its cleanup. Each dir names its parent's pid; only this user's dirs are touched."""
    import shutil

    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{CHILD_DIR_PREFIX}*"):
        pid_text = folder.name[len(CHILD_DIR_PREFIX):].split("-", 1)[0]
        try:
            if folder.stat().st_uid != os.getuid() or not pid_text.isdigit():
                continue
            os.kill(int(pid_text), 0)
            continue  # its parent is alive
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except OSError:
            continue
    return removed


def run_in_child(target: str | Callable[..., Any], timeout_s: float, args: Sequence[Any] = (),
                 kwargs: Mapping[str, Any] | None = None, *, log_path: Path | None = None,
                 kill_grace_s: float = 10.0, env: Mapping[str, str] | None = None) -> ChildResult:
    """Run ``target(*args, **kwargs)`` in a fresh Python process, in its own process group.

    Arguments and the return value travel as pickles through temp files (so they must be picklable;
    ``Path`` and plain data are). On timeout the whole group gets SIGTERM, ``kill_grace_s`` later
    SIGKILL, and the result is ``status="timeout"``. :func:`kill_children` (used at shutdown) ends
    running children the same way and their results read ``status="killed"``.
    """
    ref = target_ref(target)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"{CHILD_DIR_PREFIX}{os.getpid()}-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.pkl", Path(tmp) / "out.pkl"
        spec_path.write_bytes(pickle.dumps({"target": ref, "args": tuple(args), "kwargs": dict(kwargs or {}),
                                            "out": str(out_path), "parent": os.getpid()}))
        child_env = dict(os.environ if env is None else env)
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        stdout: Any = subprocess.DEVNULL
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            stdout = open(log_path, "ab")  # noqa: SIM115 (closed below, after the child is gone)
        try:
            proc = spawn([sys.executable, "-c", CHILD_BOOT, str(spec_path)], stdin=subprocess.DEVNULL,
                         stdout=stdout, stderr=subprocess.STDOUT, env=child_env, close_fds=True)
            with _CHILDREN_LOCK:
                _CHILDREN[proc.pid] = proc
            status = None
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.error("child %s (pid %d) exceeded its %.0f s timeout; killing its process group",
                          ref, proc.pid, timeout_s)
                kill_group(proc, kill_grace_s, reap_s=5.0)
                status = "timeout"
            finally:
                with _CHILDREN_LOCK:
                    killed = getattr(proc, "_guard_killed", False)
                    _CHILDREN.pop(proc.pid, None)
        finally:
            if log_path is not None:
                stdout.close()
        duration = time.monotonic() - started
        common = {"returncode": proc.returncode, "duration_s": duration, "pid": proc.pid,
                  "log_path": str(log_path) if log_path else None}
        if status == "timeout":
            return ChildResult("timeout", error=f"killed after the {timeout_s:.0f} s timeout", **common)
        if killed:
            return ChildResult("killed", error="killed at daemon shutdown", **common)
        try:
            outcome = pickle.loads(out_path.read_bytes())
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            return ChildResult("error", error=f"child exited {proc.returncode} without a result ({exc})", **common)
        if outcome.get("ok"):
            return ChildResult("ok", value=outcome.get("value"), **common)
        return ChildResult("error", error=outcome.get("error"), **common)


def child_main(spec_path: str) -> int:
    """Entry point inside the child: load the spec, call the target, pickle the outcome."""
    spec = pickle.loads(Path(spec_path).read_bytes())
    out = Path(spec["out"])
    watch_parent(spec.get("parent"))
    from mamba2_kernels.targets import load_target

    try:
        value = load_target(spec["target"])(*spec["args"], **spec["kwargs"])
        outcome = {"ok": True, "value": value}
    except BaseException:  # noqa: BLE001 (report everything, SystemExit too)
        outcome = {"ok": False, "error": traceback.format_exc()}
        traceback.print_exc()
    try:
        data = pickle.dumps(outcome)
    except Exception as exc:  # noqa: BLE001
        data = pickle.dumps({"ok": False, "error": f"result is not picklable: {exc}"})
    atomic_write(out, data)
    sys.stdout.flush()
    return 0 if outcome["ok"] else 1


def kill_children(kill_grace_s: float = 10.0) -> int:
    """Stop every running :func:`run_in_child` child (process groups); returns how many there were."""
    with _CHILDREN_LOCK:
        procs = list(_CHILDREN.values())
        for p in procs:
            p._guard_killed = True  # type: ignore[attr-defined]
    threads = [threading.Thread(target=kill_group, args=(p, kill_grace_s), kwargs={"reap_s": 5.0}, daemon=True)
               for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(kill_grace_s + 10)
    return len(procs)
