"""One shard of a sharded bench in a child process: ``python -m mamba2_guard.bench.worker SPEC.json``.

``mamba2_guard.bench.shard`` starts one of these per GPU, in its own session, with ``CUDA_VISIBLE_DEVICES`` set
to that GPU. The spec names the bench function (``module:function`` or ``/path/file.py:function``; tests
pass a fake one), this worker's jobs (kernel x shape, with their plan index) and the settings (seed,
rounds, warmup, CUDA graphs): the same for every worker, so a case measures the same way on any GPU.

The bench function is a generator ``bench(spec, note)`` that yields one ``CaseResult`` (or its dict) per
job, in the order of ``spec["jobs"]``; ``note(**fields)`` records facts about the worker (``gpu``: its
identity; ``phase``: ``"lock"`` while it waits for the GPU lock, ``"ready"`` when measuring starts;
``lock_wait_s``, ``setup_s``). After every case (and every note) the whole state is rewritten atomically
to ``spec["result"]``: the parent merges what is there, so a worker that crashes or hangs loses only the
cases it had not finished, and the file's changes are the heartbeat the parent's hard timeout watches.

``real_bench`` is the real one: its own GPU lock (keyed by the GPU's UUID, as ``run_bench``), its own
NVML handle (by UUID: NVML ignores ``CUDA_VISIBLE_DEVICES``), the cached device peaks (measured once per
fingerprint under a file lock, so every worker uses the same), and ``mamba2_guard.bench.run.bench_case`` for
every job, exactly as the sequential run calls it.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DEFAULT_BENCH = "mamba2_guard.bench.worker:real_bench"
BENCH_ENV = "MAMBA2_GUARD_BENCH_FN"

Note = Callable[..., None]


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # ptxas and compile workers
    return round(own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime, 3)


def _case_dict(case: Any) -> dict[str, Any]:
    if hasattr(case, "to_dict"):
        return case.to_dict()
    if isinstance(case, dict):
        return dict(case)
    raise TypeError(f"bench function yielded {type(case).__name__}, expected a CaseResult or a dict")


def main(argv: list[str] | None = None) -> int:
    from mamba2_guard.adapters.processes import watch_parent
    from mamba2_kernels.files import atomic_write
    from mamba2_kernels.targets import load_target

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m mamba2_guard.bench.worker SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    if spec.get("parent_pid"):
        watch_parent(int(spec["parent_pid"]), interval_s=0.2)
    started = time.monotonic()
    result_path = Path(spec["result"])
    state: dict[str, Any] = {"worker": spec.get("worker"), "device": spec.get("device"), "pid": os.getpid(),
                             "phase": "start", "gpu": None, "cases": [], "done": False, "error": None}
    mark = [started]

    def write() -> None:
        state["wall_s"] = round(time.monotonic() - started, 3)
        state["cpu_s"] = _cpu_seconds()
        atomic_write(result_path, json.dumps(state, sort_keys=True, default=str, allow_nan=False) + "\n")

    def note(**fields: Any) -> None:
        state.update(fields)
        if fields.get("phase") == "ready":
            state.setdefault("setup_s", round(time.monotonic() - started, 3))
            mark[0] = time.monotonic()
        write()

    write()
    bench = load_target(spec["bench"])
    jobs = list(spec["jobs"])
    try:
        for i, case in enumerate(bench(spec, note)):
            if i >= len(jobs):
                raise RuntimeError(f"bench function yielded more cases than the {len(jobs)} jobs")
            now = time.monotonic()
            state["cases"].append({"index": jobs[i]["index"], "case": _case_dict(case),
                                   "wall_s": round(now - mark[0], 3)})
            mark[0] = now
            write()
    except Exception as exc:  # recorded for the parent; the cases already written stand
        frames = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f" at {frames[0].filename}:{frames[0].lineno}" if frames else ""
        state["error"] = f"{type(exc).__name__}: {exc}{where}"
        traceback.print_exc()
        write()
        return 1
    state["done"] = True
    state["phase"] = "done"
    write()
    return 0


# ----------------------------------------------------------------------------------------------
# The real bench function


def gpu_identity(device_token: str | None) -> dict[str, Any]:
    """This process's GPU (torch's device 0 under ``CUDA_VISIBLE_DEVICES``): host index, UUID, name.
    The host index is the ``CUDA_VISIBLE_DEVICES`` token when it is a number (DCGM's ``gpu`` label), else
    NVML's index of the UUID."""
    from mamba2_guard.adapters import fingerprint

    fp = fingerprint.collect(0)
    index: int | None = int(device_token) if device_token and device_token.isdigit() else None
    if index is None and fp.gpu_uuid:
        index = _nvml_index(fp.gpu_uuid)
    return {"index": index, "uuid": fp.gpu_uuid, "name": fp.gpu_name, "fingerprint_digest": fp.digest()}


def _nvml_index(uuid: str) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def _timed_first_call(entry, shape, seed: int, device) -> float | None:
    """Seconds of the first Helion call at this shape: compile (CPU) + one run. Later calls hit the cache,
    so ``bench_case`` measures as it would have; a failure is left for ``bench_case`` to report."""
    import torch

    if not entry.has_helion:
        return None
    t0 = time.monotonic()
    try:
        inputs = entry.inputs(shape, seed, device)
        entry.run_helion(inputs)
        torch.cuda.synchronize()
    except Exception:
        return None
    finally:
        inputs = None
        torch.cuda.empty_cache()
    return round(time.monotonic() - t0, 3)


def real_bench(spec: dict[str, Any], note: Note) -> Iterator[Any]:
    import dataclasses

    import torch

    if not torch.cuda.is_available():
        from mamba2_kernels.testing import enable_cpu_interpret

        enable_cpu_interpret()
    from filelock import FileLock

    from mamba2_guard.bench import peaks as peaks_mod
    from mamba2_guard.bench.run import bench_case, gpu_lock
    from mamba2_kernels import registry, suites

    loaded = suites.load()
    seed, state_dir = int(spec["seed"]), Path(spec["state_dir"])
    jobs = [(registry.get(j["kernel"]), loaded.shape(j["shape"])) for j in spec["jobs"]]
    if not torch.cuda.is_available():
        note(gpu=None, phase="ready")
        for entry, shape in jobs:
            yield bench_case(entry, shape, seed=seed, device=torch.device("cpu"), rounds=1, warmup=0, timer=None,
                             nvml=None, peaks={})
        return
    from mamba2_guard.bench.nvml import Nvml
    from mamba2_guard.bench.timing import Timer

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    gpu = gpu_identity(spec.get("device"))
    note(gpu=gpu, phase="lock")
    t0 = time.monotonic()
    with gpu_lock(state_dir, gpu["uuid"] or str(spec.get("device"))):
        lock_wait = round(time.monotonic() - t0, 3)
        if spec.get("peaks", True):
            with FileLock(str(state_dir / "peaks" / f"{spec['fingerprint_digest'][:16]}.lock")):
                peaks = peaks_mod.cached(state_dir, spec["fingerprint_digest"])
        else:
            peaks = {}
        timer, nvml = Timer(device), Nvml(uuid=gpu["uuid"])
        note(phase="ready", lock_wait_s=lock_wait)
        for entry, shape in jobs:
            compile_s = _timed_first_call(entry, shape, seed, device)
            case = bench_case(entry, shape, seed=seed, device=device, rounds=int(spec["rounds"]),
                              warmup=int(spec["warmup"]), timer=timer, nvml=nvml, peaks=peaks,
                              cuda_graphs=bool(spec.get("cuda_graphs")))
            if compile_s is not None:
                case = dataclasses.replace(case, extra={**case.extra, "first_call_s": compile_s})
            yield case


if __name__ == "__main__":
    sys.exit(main())
