"""The bench sharded over the host's GPUs: ``mamba2-guard bench --workers N|auto`` (and nightly's ``workers``).

The jobs are the sequential run's cases (kernel x shape, shape-major: ``mamba2_guard.core.tuneplan.plan_jobs``),
assigned by ``mamba2_guard.core.tuneplan.assign`` (job i -> worker i mod n: static, deterministic, the autotune's
own assignment). Each worker is a child process (``python -m mamba2_guard.bench.worker``) in its own session with
``CUDA_VISIBLE_DEVICES`` set to one GPU, its own GPU lock and NVML handle, and the same seed, rounds and
warm-up as every other. It rewrites its finished cases atomically to a JSON file under
``<state>/shards/<run>/`` after each case; the parent merges those files in plan order into one
``BenchResult`` (layer shares computed over the merged cases, as the sequential run does), so verdicts,
reports, baselines and history are computed exactly as for a single-GPU run. As the workers finish cases,
the parent hands the merged cases so far, marked partial as ``run_bench`` marks them, to the caller's
checkpoint (``bench --json`` rewrites its file); a resumed run gives the workers only the cases it does not keep.

Per case, ``extra`` records where it was measured (``worker``, ``device`` = the CUDA_VISIBLE_DEVICES value,
``gpu_index``, ``gpu_uuid``, ``gpu_name``, ``wall_s``); the result's ``extra["sharding"]`` records the split
(jobs per worker, per-worker wall, setup, lock wait and CPU seconds, the longest single job, the ideal
and actual wall times). A worker that crashes, or makes no progress for ``case_timeout_s`` (its process
group is killed), turns only its unfinished cases into errors. The confirmation re-run of a flagged case
(``check``) runs in a new worker on the GPU that measured the case (``rerun_on_measuring_gpu``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mamba2_guard.adapters.files import tail
from mamba2_guard.adapters.processes import kill_group, signal_name, spawn
from mamba2_guard.bench.worker import BENCH_ENV, DEFAULT_BENCH
from mamba2_guard.core.results import BenchResult, CaseResult, SchemaError
from mamba2_guard.core.tuneplan import Job, assign, plan_jobs
from mamba2_kernels.files import atomic_write, load_json

Progress = Callable[[str], None]
DEFAULT_CASE_TIMEOUT_S = 1800.0  # no finished case for this long: the worker is hung (compile + 30 rounds ~ 1 min)
AUTO = "auto"


# ----------------------------------------------------------------------------------------------
# How many workers


def parse_workers(value: Any) -> int | str:
    """``auto`` or a positive integer; anything else is a ``ValueError`` naming ``workers``."""
    if isinstance(value, bool):
        raise ValueError(f"workers: expected a positive integer or 'auto', got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        text = str(value).strip().lower()
        if text == AUTO:
            return AUTO
        try:
            n = int(text)
        except ValueError:
            raise ValueError(f"workers: expected a positive integer or 'auto', got {value!r}") from None
    if n < 1:
        raise ValueError(f"workers: expected a positive integer or 'auto', got {value!r}")
    return n


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_workers(value: Any, gpus: int | None = None) -> int:
    """``auto``: one per visible GPU (1 without GPUs). A number above the GPU count is capped to it on a
    GPU host (two workers on one GPU would only queue on its lock); on a CPU host it is kept (CPU
    interpret mode, or a test's fake bench)."""
    parsed = parse_workers(value)
    gpus = gpu_count() if gpus is None else gpus
    if parsed == AUTO:
        return max(1, gpus)
    return min(parsed, gpus) if gpus else parsed  # type: ignore[type-var]


def visible_devices(workers: int | None = None) -> list[str]:
    """One CUDA_VISIBLE_DEVICES value per GPU of the host (as this process sees them); with ``workers``,
    that many values, round-robin over the GPUs (the autotune's rule too)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in env.split(",") if d.strip()][:count] if env else [str(i) for i in range(count)]
    ids = ids or ["0"]
    if workers is not None:
        ids = [ids[i % len(ids)] for i in range(workers)] if workers > len(ids) else ids[:workers]
    return ids


def devices_for(workers: int) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value of each worker (the autotune's rule)."""
    return visible_devices(workers)


def bench_fn_ref(explicit: str | None = None) -> str:
    return explicit or os.environ.get(BENCH_ENV) or DEFAULT_BENCH


# ----------------------------------------------------------------------------------------------
# Running the workers


def _kill_group(proc: subprocess.Popen) -> None:
    kill_group(proc, 2.0)


def _read(path: Path) -> dict[str, Any] | None:
    """A worker's result, or None where it left none that the bounded reader can parse."""
    try:
        return load_json(path)
    except (OSError, ValueError):  # JSON, decoding and UnreadableFile errors
        return None


class _Worker:
    def __init__(self, index: int, device: str, jobs: list[Job], run_dir: Path, spec: dict[str, Any]):
        self.index, self.device, self.jobs = index, device, jobs
        self.spec_path = run_dir / f"worker-{index}.spec.json"
        self.result_path = run_dir / f"worker-{index}.result.json"
        self.log_path = run_dir / f"worker-{index}.log"
        self.spec = {**spec, "worker": index, "device": device, "jobs": [j.to_dict() for j in jobs],
                     "result": str(self.result_path)}
        self.proc: subprocess.Popen | None = None
        self.status = "running"  # ok | crash | timeout
        self.detail = ""
        self.started = self.finished = 0.0
        self.last_change = 0.0
        self._mtime = -1

    def start(self) -> None:
        from mamba2_guard import PROJECT_ROOT

        self.result_path.unlink(missing_ok=True)
        atomic_write(self.spec_path, json.dumps(self.spec, indent=1, sort_keys=True, default=str) + "\n")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=self.device, PYTHONUNBUFFERED="1")
        self.started = self.last_change = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = spawn([sys.executable, "-m", "mamba2_guard.bench.worker", str(self.spec_path)],
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                              cwd=str(PROJECT_ROOT))

    def state(self) -> dict[str, Any] | None:
        return _read(self.result_path)

    def poll(self, case_timeout_s: float) -> bool:
        """True while the worker runs; enforces the no-progress hard timeout."""
        assert self.proc is not None
        if self.status != "running":
            return False
        with contextlib.suppress(OSError):
            mtime = self.result_path.stat().st_mtime_ns
            if mtime != self._mtime:
                self._mtime = mtime
                self.last_change = time.monotonic()
        rc = self.proc.poll()
        if rc is not None:
            self.finished = time.monotonic()
            state = self.state() or {}
            if rc == 0 and state.get("done"):
                self.status = "ok"
            else:
                self.status = "crash"
                why = state.get("error") or tail(self.log_path)
                self.detail = f"crashed ({signal_name(rc)}{': ' + why if why else ''})"
            return False
        waiting_for_lock = (self.state() or {}).get("phase") == "lock"  # the lock has its own timeout
        if not waiting_for_lock and time.monotonic() - self.last_change > case_timeout_s:
            _kill_group(self.proc)
            self.finished = time.monotonic()
            self.status = "timeout"
            self.detail = f"hung: no case finished in {case_timeout_s:.0f}s (hard timeout, process group killed)"
            return False
        return True

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _kill_group(self.proc)


def run_workers(shards: Sequence[tuple[str, list[Job]]], run_dir: Path, spec: dict[str, Any], *,
                case_timeout_s: float, progress: Progress, poll_s: float = 0.1,
                on_cases: Callable[[Sequence[_Worker]], None] | None = None) -> list[_Worker]:
    """Start one worker per (device, jobs) shard and wait for all; a crash or hang ends that worker only.
    ``on_cases`` gets the workers after each poll in which some of them finished cases."""
    run_dir.mkdir(parents=True, exist_ok=True)
    workers = [_Worker(i, device, jobs, run_dir, spec) for i, (device, jobs) in enumerate(shards)]
    try:
        for w in workers:
            w.start()
        live = list(workers)
        reported = {w.index: 0 for w in workers}
        total, finished = sum(len(w.jobs) for w in workers), 0
        while live:
            time.sleep(poll_s)
            still, seen = [], finished
            for w in live:
                running = w.poll(case_timeout_s)
                cases = (w.state() or {}).get("cases") or []
                for item in cases[reported[w.index]:]:  # one line per finished case, as the sequential run
                    finished += 1
                    c = item.get("case") or {}
                    what = f"error: {c.get('error')}" if c.get("error") else "done"
                    progress(f"[{finished}/{total}] {c.get('shape')} {c.get('kernel')}: {what} "
                             f"(worker {w.index}, CUDA_VISIBLE_DEVICES={w.device}, {item.get('wall_s')}s)")
                reported[w.index] = max(reported[w.index], len(cases))
                if running:
                    still.append(w)
                else:
                    done = len((w.state() or {}).get("cases") or [])
                    extra = f": {w.detail}" if w.detail else ""
                    progress(f"worker {w.index} (CUDA_VISIBLE_DEVICES={w.device}) {w.status}, "
                             f"{done}/{len(w.jobs)} cases in {w.finished - w.started:.1f}s{extra}")
            live = still
            if on_cases is not None and finished > seen:
                on_cases(workers)
    except BaseException:
        for w in workers:
            w.kill()
        raise
    return workers


# ----------------------------------------------------------------------------------------------
# Merging


def _error_case(job: Job, phase: str, seed: int, message: str, where: dict[str, Any]) -> CaseResult:
    return CaseResult(kernel=job.kernel, shape=job.shape, phase=phase, seed=seed, error=message, extra=dict(where))


def _where(w: _Worker, gpu: dict[str, Any] | None) -> dict[str, Any]:
    gpu = gpu or {}
    index = gpu.get("index")
    if index is None and w.device.isdigit() and gpu.get("uuid"):
        index = int(w.device)
    return {"worker": w.index, "device": w.device, "gpu_index": index, "gpu_uuid": gpu.get("uuid"),
            "gpu_name": gpu.get("name")}


def finished_cases(workers: Sequence[_Worker], phases: dict[str, str], seed: int
                   ) -> tuple[dict[int, CaseResult], dict[str, float]]:
    """The cases the workers have finished, by job index, and each one's wall seconds (by job id)."""
    by_index: dict[int, CaseResult] = {}
    seconds: dict[str, float] = {}
    for w in workers:
        state = w.state() or {}
        where = _where(w, state.get("gpu"))
        mine = {j.index: j for j in w.jobs}
        for item in state.get("cases") or []:
            job = mine.get(item.get("index"))
            if job is None or job.index in by_index:
                continue
            try:
                case = CaseResult.from_dict(item.get("case"), f"worker {w.index} case {job.id}")
            except SchemaError as exc:
                case = _error_case(job, phases.get(job.kernel, ""), seed, f"worker {w.index} returned an invalid "
                                   f"case: {exc}", where)
            if case.key != (job.kernel, job.shape):
                case = _error_case(job, phases.get(job.kernel, ""), seed, f"worker {w.index} returned "
                                   f"{case.kernel}/{case.shape} for {job.id}", where)
            by_index[job.index] = dataclasses.replace(case, extra={**case.extra, **where,
                                                                    "wall_s": item.get("wall_s")})
            seconds[job.id] = float(item.get("wall_s") or 0.0)
    return by_index, seconds


def merge(jobs: Sequence[Job], workers: Sequence[_Worker], phases: dict[str, str], seed: int
          ) -> tuple[list[CaseResult], dict[str, float]]:
    """Cases in plan order; the jobs a worker did not finish become errors naming the worker and why.
    Also returns each job's wall seconds (by job id)."""
    by_index, seconds = finished_cases(workers, phases, seed)
    for w in workers:
        lost = [j for j in w.jobs if j.index not in by_index]
        if lost:
            where = _where(w, (w.state() or {}).get("gpu"))
            why = w.detail or "ended without reporting these cases"
            for n, job in enumerate(lost):
                what = "while measuring this case" if n == 0 and w.status == "timeout" else "before this case"
                by_index[job.index] = _error_case(
                    job, phases.get(job.kernel, ""), seed,
                    f"worker {w.index} (CUDA_VISIBLE_DEVICES={w.device}) {why} {what} (log {w.log_path})", where)
    return [by_index[j.index] for j in jobs], seconds


def split_report(workers: Sequence[_Worker], seconds: dict[str, float], wall_s: float, assignment: str
                 ) -> dict[str, Any]:
    """What went where and what limited the speed-up (recorded in the result's extra)."""
    per_worker = []
    for w in workers:
        state = w.state() or {}
        gpu = state.get("gpu") or {}
        per_worker.append({
            **_where(w, gpu), "jobs": [j.id for j in w.jobs], "n_jobs": len(w.jobs),
            "done": len(state.get("cases") or []), "status": w.status, "detail": w.detail or None,
            "wall_s": round((w.finished or time.monotonic()) - w.started, 3), "setup_s": state.get("setup_s"),
            "lock_wait_s": state.get("lock_wait_s"), "cpu_s": state.get("cpu_s"),
            "fingerprint_digest": gpu.get("fingerprint_digest"), "log": str(w.log_path),
        })
    longest = max(seconds.items(), key=lambda kv: kv[1], default=(None, 0.0))
    total = sum(seconds.values())
    slowest = max(per_worker, key=lambda p: p["wall_s"], default=None)
    digests = {p["fingerprint_digest"] for p in per_worker if p["fingerprint_digest"]}
    return {
        "workers": len(workers), "assignment": assignment,
        "wall_s": round(wall_s, 3), "sum_case_s": round(total, 3),
        "ideal_wall_s": round(total / len(workers), 3) if workers else None,
        "speedup_vs_sum": round(total / wall_s, 3) if wall_s > 0 else None,
        "longest_job": {"job": longest[0], "wall_s": round(longest[1], 3)},
        "slowest_worker": None if slowest is None else slowest["worker"],
        "host_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "mixed_fingerprints": len(digests) > 1, "per_worker": per_worker,
    }


def previous_case_seconds(state_dir: Path) -> tuple[dict[str, float], str | None]:
    """Seconds per case ("kernel@shape") of the newest earlier sharded run in ``state_dir`` that finished
    any case, and its folder; ({}, None) when there is none."""
    runs = sorted((state_dir / "shards").glob("*/"), reverse=True) if (state_dir / "shards").is_dir() else []
    for run in runs:
        seconds: dict[str, float] = {}
        for path in sorted(run.glob("worker-*.result.json")):
            for item in (_read(path) or {}).get("cases") or []:
                case = item.get("case") or {}
                if case.get("kernel") and case.get("shape") and isinstance(item.get("wall_s"), int | float):
                    seconds[f"{case['kernel']}@{case['shape']}"] = float(item["wall_s"])
        if seconds:
            return seconds, str(run)
    return {}, None


# ----------------------------------------------------------------------------------------------
# Entry points


def run_sharded(entries: Sequence[Any], shapes: Sequence[Any], *, fingerprint: dict[str, Any],
                fingerprint_digest: str, state_dir: Path, suite: str | None, workers: int, seed: int = 0,
                rounds: int = 30, warmup: int = 3, progress: Progress, cuda_graphs: bool = False,
                devices: Sequence[str] | None = None, bench_fn: str | None = None,
                case_timeout_s: float = DEFAULT_CASE_TIMEOUT_S, extra: dict[str, Any] | None = None,
                done: Sequence[CaseResult] = (), started_at: str | None = None,
                checkpoint: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """Bench ``entries`` x ``shapes`` over ``workers`` child processes; one merged ``BenchResult``.
    ``done`` and ``started_at``: a resumed run's, as ``run_bench``; ``checkpoint`` gets the result so far
    (``run_bench``'s partial marking) whenever workers have finished cases."""
    import torch

    from mamba2_guard.bench.run import result_so_far, resumed_plan

    devices = list(devices) if devices is not None else devices_for(workers)
    if len(devices) != workers:
        raise ValueError(f"devices: expected {workers} CUDA_VISIBLE_DEVICES values, got {len(devices)}")
    started = started_at or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    plan = plan_jobs([e.name for e in entries], [s.name for s in shapes])
    kept, planned = resumed_plan(done, [(j.shape, j.kernel) for j in plan], progress)
    measured = {(c.shape, c.kernel) for c in kept}
    # numbered among the cases left, so that round-robin spreads them evenly over the workers
    jobs = [Job(i, j.kernel, j.shape) for i, j in enumerate(j for j in plan if (j.shape, j.kernel) not in measured)]
    phases = {e.name: e.phase for e in entries}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    settings = {"seed": seed, "rounds": rounds, "device": device, "cuda_graphs": cuda_graphs}

    def result(cases: Sequence[CaseResult], more: dict[str, Any]) -> BenchResult:
        return result_so_far([*kept, *cases], planned, fingerprint=fingerprint,
                             device_peaks=_peaks(state_dir, fingerprint_digest, device), suite=suite,
                             started_at=started, extra={**settings, **more})

    def save(running: Sequence[_Worker]) -> None:
        if checkpoint is not None:
            checkpoint(result(list(finished_cases(running, phases, seed)[0].values()), {}))

    cost, cost_source = previous_case_seconds(Path(state_dir))
    shards = [(devices[i], shard) for i, shard in enumerate(assign(jobs, workers, cost)) if shard]
    run_dir = Path(state_dir) / "shards" / f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
    spec = {"bench": bench_fn_ref(bench_fn), "seed": seed, "rounds": rounds, "warmup": warmup,
            "cuda_graphs": cuda_graphs, "state_dir": str(state_dir), "fingerprint_digest": fingerprint_digest,
            "parent_pid": os.getpid(), "extra": dict(extra or {})}
    progress(f"sharded bench: {len(jobs)} cases over {len(shards)} worker(s) on CUDA_VISIBLE_DEVICES "
             f"{', '.join(d for d, _ in shards)} ({run_dir})")
    t0 = time.monotonic()
    ran = run_workers(shards, run_dir, spec, case_timeout_s=case_timeout_s, progress=progress, on_cases=save)
    wall = time.monotonic() - t0
    cases, seconds = merge(jobs, ran, phases, seed)
    split = split_report(ran, seconds, wall, f"longest first, by the case times of {cost_source}" if cost_source
                         else "round-robin by plan index (no earlier sharded run in the state dir)")
    if split["mixed_fingerprints"]:
        progress("warning: the workers' GPUs have different fingerprints (mixed models or drivers on this host)")
    if jobs:  # a resumed run that kept every case ran none
        progress(f"sharded bench: {wall:.1f}s wall for {split['sum_case_s']:.1f}s of cases; longest case "
                 f"{split['longest_job']['job']} {split['longest_job']['wall_s']:.1f}s")
    return result(cases, {"sharding": split})


def _peaks(state_dir: Path, digest: str, device: str) -> dict[str, Any]:
    """The peaks the workers used (cached by the first of them); ``{}`` on a CPU, as ``run_bench``."""
    if device != "cuda":
        return {}
    return _read(Path(state_dir) / "peaks" / f"{digest[:16]}.json") or {}


def bench(entries: Sequence[Any], shapes: Sequence[Any], *, fingerprint: dict[str, Any], fingerprint_digest: str,
          state_dir: Path, suite: str | None, seed: int = 0, rounds: int = 30, progress: Progress,
          cuda_graphs: bool = False, workers: Any = 1, bench_fn: str | None = None,
          case_timeout_s: float = DEFAULT_CASE_TIMEOUT_S, resumed: BenchResult | None = None,
          checkpoint: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """``run_bench`` in this process for one worker and the real bench (today's behaviour), else
    ``run_sharded``. Either continues ``resumed``'s cases and start, and gives ``checkpoint`` the result so
    far as cases finish."""
    from mamba2_guard.bench.run import run_bench

    n = resolve_workers(workers)
    resume: dict[str, Any] = {"done": resumed.cases if resumed else (),
                              "started_at": resumed.started_at if resumed else None, "checkpoint": checkpoint}
    if n == 1 and bench_fn is None and not os.environ.get(BENCH_ENV):
        return run_bench(entries, shapes, fingerprint=fingerprint, fingerprint_digest=fingerprint_digest,
                         state_dir=state_dir, suite=suite, seed=seed, rounds=rounds, progress=progress,
                         cuda_graphs=cuda_graphs, **resume)
    asked = parse_workers(workers)
    if asked != AUTO and n < asked:  # type: ignore[operator]
        progress(f"--workers {asked}: capped to the {n} visible GPU(s)")
    return run_sharded(entries, shapes, fingerprint=fingerprint, fingerprint_digest=fingerprint_digest,
                       state_dir=state_dir, suite=suite, workers=n, seed=seed, rounds=rounds, progress=progress,
                       cuda_graphs=cuda_graphs, bench_fn=bench_fn, case_timeout_s=case_timeout_s, **resume)


def rerun_on_measuring_gpu(result: BenchResult, *, state_dir: Path, seed: int, rounds: int, cuda_graphs: bool,
                           fingerprint_digest: str, progress: Progress, bench_fn: str | None = None,
                           case_timeout_s: float = DEFAULT_CASE_TIMEOUT_S):
    """For a sharded result: the confirmation re-run of one case, in a fresh worker on the GPU that measured
    it (seed + 1, no roofline, as ``mamba2_guard.flows.nightly.rerun_on_device``). None for an unsharded result."""
    if "sharding" not in (result.extra or {}):
        return None
    counter = [0]

    def rerun(case: CaseResult) -> CaseResult:
        device = str(case.extra.get("device") or "0")
        counter[0] += 1
        job = Job(0, case.kernel, case.shape)
        run_dir = Path(state_dir) / "shards" / (f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
                                                f"-confirm{counter[0]}")
        spec = {"bench": bench_fn_ref(bench_fn), "seed": seed + 1, "rounds": rounds, "warmup": 3,
                "cuda_graphs": cuda_graphs, "state_dir": str(state_dir), "fingerprint_digest": fingerprint_digest,
                "parent_pid": os.getpid(), "peaks": False, "extra": {"confirmation": True}}
        done = run_workers([(device, [job])], run_dir, spec, case_timeout_s=case_timeout_s, progress=progress)
        cases, _ = merge([job], done, {case.kernel: case.phase}, seed + 1)
        return cases[0]

    return rerun
