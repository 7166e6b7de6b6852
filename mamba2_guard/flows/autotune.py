"""``mamba2-guard autotune``: the offline config generator.

One job per registry kernel x suite shape, run in a child process (``python -m mamba2_guard.flows.autotune_worker``)
in its own session with a hard timeout per job: a candidate that crashes or hangs costs that job only
(recorded as failed, with its log), never the run. Jobs are sharded over the host's GPUs, one worker
thread per GPU driving one long-lived child (``TunerProcess``: imports, CUDA context and compiled
kernels are paid once; restarted after a job that crashed or hung it) with ``CUDA_VISIBLE_DEVICES`` set
to that GPU; the assignment is static
(``mamba2_guard.core.tuneplan.assign``) and results are merged by plan order, so any number of GPUs merges the
same job results into the file a sequential run would (which earlier winners a job is measured against and
seeded from depends, with several GPUs, on which jobs finished before it).

State, under ``<state>/autotune/<slug>-<run id>/`` (the run id hashes the plan, so a rerun of the same
plan resumes it, and ``--fresh`` starts over)::

    plan.json        the plan and its settings (seed, effort, budgets, criteria)
    fingerprint.json the environment it runs under: a later run of the same search settings and the same
                     kernel-shaping sources (``tuneplan.search_identity``) skips the launches this one searched
    base.yaml        the config file as it was when the run started: what the merge starts from; a job's
                     incumbents are the base with the winners of the jobs finished before it
                     (``jobs/<job>.served.yaml``), as the runtime serves them: no key is searched twice
                     in a run, so a launch is never measured against its own earlier winner
    journal.jsonl    one line per finished job attempt, appended and fsynced when the job ends
    jobs/            each job's spec and result JSON
    logs/<job>.log   the job's output; logs/<job>.* Helion's autotune logs (HELION_AUTOTUNE_LOG);
                     logs/worker-<i>.log what the child printed between jobs

After every job the journal's winners are written over the config file as it is then, atomically (temp
file, fsync, rename): a kill at any moment leaves the previous or the next complete file, and what reached
the file since the run began (another run's winners, a fitted rule, a merged config PR) stays. A winner is
kept only when ``mamba2_guard.core.tuneplan.decide`` says so (precision passes, faster than the incumbent by the
margin, interleaved samples); otherwise the committed config stays.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mamba2_guard import PROJECT_ROOT
from mamba2_guard.adapters.files import tail as tail_of
from mamba2_guard.adapters.fingerprint import kernel_shaping
from mamba2_guard.adapters.processes import kill_group, signal_name, spawn
from mamba2_guard.adapters.state import exclusive
from mamba2_guard.core import tuneplan
from mamba2_guard.core.fingerprint_hash import fingerprint_hash
from mamba2_guard.core.tuneplan import Criteria, Job
from mamba2_kernels import config_store
from mamba2_kernels.files import UnreadableFile, atomic_write, load_json, read_regular
from mamba2_kernels.ssd import forcing

log = logging.getLogger(__name__)

DEFAULT_TUNER = "mamba2_guard.flows.autotune_worker:helion_tuner"
TUNER_ENV = "MAMBA2_GUARD_TUNER"
Progress = Callable[[str], None]


@dataclass
class AutotuneOptions:
    kernels: Sequence[str]
    shapes: Sequence[str]
    out: Path
    state_dir: Path
    gpu_slug: str
    fingerprint: dict[str, Any] = field(default_factory=dict)
    fingerprint_digest: str = ""
    effort: str = "quick"
    seed: int = 1234
    budget_seconds: float = 300.0  # per job (Helion's budget, split over the job's launches)
    total_budget_seconds: float | None = None  # a job starts only while its expected time still fits
    job_timeout_seconds: float | None = None  # hard kill; default 2 x budget + 120 s (compile, validation)
    rounds: int = 30
    max_attempts: int = 2
    # Helion's own per-search benchmark subprocess: isolation the job's child already gives (hard timeout,
    # restart), at ~15 s of cold start per launch on an H200, longer than a quick budget (see the docs).
    helion_benchmark_subprocess: bool = False
    whole_suite: bool = True  # the plan covers every tuned kernel x suite shape (``covers_whole_suite``)
    criteria: Criteria = field(default_factory=Criteria)
    devices: Sequence[str] = ("0",)  # CUDA_VISIBLE_DEVICES value of each worker
    tuner: str = DEFAULT_TUNER
    fresh: bool = False
    missing_only: bool = False  # search only launches whose key has no config of its own in the file
    # Fused stages forced to another path (``mamba2_kernels.ssd.forcing``) in a second capture of each job's call,
    # whose launches are searched too: a GPU without a path rule yet gets configs for the path it does not run,
    # so that timing the two paths against each other compares tuned launches.
    also_paths: Mapping[str, str] = field(default_factory=dict)
    # "helion": Helion's search; "borrowed": the configs other GPUs' files hold, adapted and tried here (bring-up)
    search: str = "helion"
    extra: dict[str, Any] = field(default_factory=dict)  # handed to the tuner (tests)
    # shapes whose jobs start before the others, in this order (``tuneplan.assign``): not part of the plan
    first_shapes: Sequence[str] = ()

    def __post_init__(self) -> None:
        for name in ("budget_seconds", "total_budget_seconds", "job_timeout_seconds", "rounds", "max_attempts",
                     "seed"):
            problem = tuneplan.setting_problem(name, getattr(self, name))
            if problem:
                raise ValueError(f"{name}: {problem}")
        if self.effort not in ("quick", "full"):
            raise ValueError(f"effort: expected quick or full, got {self.effort!r}")
        if self.search not in ("helion", "borrowed"):
            raise ValueError(f"search: expected helion or borrowed, got {self.search!r}")
        try:
            forcing.parse(",".join(f"{stage}={path}" for stage, path in self.also_paths.items()))
        except ValueError as exc:
            raise ValueError(f"also_paths: {exc}") from None

    @property
    def job_timeout(self) -> float:
        if self.job_timeout_seconds is not None:
            return float(self.job_timeout_seconds)
        return 2 * float(self.budget_seconds) + 120.0


def covers_whole_suite(kernels: Sequence[str], shapes: Sequence[str], suite: str = "default") -> bool:
    """Whether a plan reaches every Helion kernel at every shape of ``suite``: only such a run may stamp
    the config file with its environment."""
    from mamba2_kernels import registry, suites

    every = {e.name for e in registry.select(None) if e.has_helion}
    return every <= set(kernels) and {s.name for s in suites.load().suite(suite)} <= set(shapes)


# A warm-started re-tune after drift: 10 s of search per job kept 5 winners in 21 jobs on an H200, at 25 s
# per job all in; 30 minutes a run, and a run that does not finish resumes from its journal the next time.
# A first tune of a new GPU deserves more: ``mamba2-guard autotune --budget-seconds 300``.
DEFAULT_BUDGET_SECONDS = 10.0
DEFAULT_TOTAL_BUDGET_SECONDS = 1800.0


def config_options(cfg: Any) -> dict[str, Any]:
    """The ``AutotuneOptions`` fields the guard config's ``autotune`` section sets, with the embedded
    defaults where it is silent (the CLI's flags override them)."""
    return {"effort": cfg.autotune_value("effort", "quick"), "seed": cfg.autotune_value("seed", 1234),
            "budget_seconds": cfg.autotune_value("budget_seconds", DEFAULT_BUDGET_SECONDS),
            "total_budget_seconds": cfg.autotune_value("total_budget_seconds", DEFAULT_TOTAL_BUDGET_SECONDS),
            "job_timeout_seconds": cfg.autotune_value("job_timeout_seconds", None),
            "rounds": cfg.autotune_value("rounds", 30), "max_attempts": cfg.autotune_value("max_attempts", 2),
            "helion_benchmark_subprocess": cfg.autotune_value("helion_benchmark_subprocess", False),
            "criteria": cfg.criteria}


@dataclass
class AutotuneOutcome:
    run_dir: Path
    out: Path
    jobs: list[Job]
    entries: list[dict[str, Any]]
    summary: dict[str, Any]
    changed: bool  # the kernels section differs from the committed one
    written: bool  # the config file was (re)written by this run
    skipped: list[str] = field(default_factory=list)  # not started: the overall budget ran out

    @property
    def complete(self) -> bool:
        return self.summary["ok"] == self.summary["jobs"]

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "out": str(self.out), "summary": self.summary,
                "changed": self.changed, "written": self.written, "skipped": self.skipped,
                "complete": self.complete}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@=-]+", "_", name)


def _run_dir_name(gpu_slug: str, run_id: str) -> str:
    """A run's directory under ``<state>/autotune``: a run set aside by ``--fresh`` no longer has this name."""
    return f"{_safe(gpu_slug)}-{run_id}"


def earlier_runs(tuned: dict[str, Any], keep: int = 10) -> list[dict[str, Any]]:
    """The provenance of the runs behind a config file, newest last: a re-tune that keeps some of the
    old configs keeps the record of how they were made."""
    if not tuned:
        return []
    runs = [*tuned.get("earlier", []), {k: v for k, v in tuned.items() if k not in {"earlier", "searches_failed"}}]
    return runs[-keep:]


class Run:
    """One run directory: plan, base, journal; the config file updated with the journal's winners."""

    def __init__(self, opts: AutotuneOptions, progress: Progress):
        self.opts = opts
        self.progress = progress
        self.jobs = tuneplan.plan_jobs(opts.kernels, opts.shapes)
        self.order = {j.id: j.index for j in self.jobs}
        self.plan = {"jobs": [j.id for j in self.jobs], "effort": opts.effort, "seed": opts.seed,
                     "budget_seconds": opts.budget_seconds, "fingerprint_digest": opts.fingerprint_digest,
                     "gpu_slug": opts.gpu_slug, "out": str(Path(opts.out).resolve()), "tuner": opts.tuner,
                     "criteria": opts.criteria.to_dict(), "rounds": opts.rounds,
                     "helion_benchmark_subprocess": opts.helion_benchmark_subprocess,
                     **({"missing_only": True} if opts.missing_only else {}),  # earlier runs' ids unchanged
                     **({"search": opts.search} if opts.search != "helion" else {}),
                     **({"also_paths": dict(sorted(opts.also_paths.items()))} if opts.also_paths else {})}
        self.id = tuneplan.run_id(self.plan)
        self.dir = Path(opts.state_dir) / "autotune" / _run_dir_name(opts.gpu_slug, self.id)
        self.journal = self.dir / "journal.jsonl"
        self.lock = threading.Lock()
        self.faulted: set[str] = set()  # kernels whose search crashed a child in this GPU's runs (``_run``)
        if opts.fresh and self.dir.exists():
            aside = self.dir.with_name(self.dir.name + time.strftime("-old-%Y%m%dT%H%M%S"))
            self.dir.rename(aside)
            progress(f"--fresh: previous run moved to {aside}")
        (self.dir / "jobs").mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        if not (self.dir / "plan.json").exists():
            atomic_write(self.dir / "plan.json", json.dumps(self.plan, indent=1, sort_keys=True) + "\n")
        if not (self.dir / "fingerprint.json").exists():
            atomic_write(self.dir / "fingerprint.json",
                         json.dumps(opts.fingerprint, indent=1, sort_keys=True, default=str) + "\n")
        self.identity = search_identity(self.plan, opts.fingerprint)
        self.carried: list[dict[str, Any]] = []  # earlier runs' entries of this identity (``searched_before``)
        base_path = self.dir / "base.yaml"
        if not base_path.exists():
            out = Path(opts.out)
            current = config_store.load(out) if out.exists() else config_store.ConfigFile()
            config_store.save(base_path, current)
        self.base_path = base_path
        self.base = config_store.load(base_path)

    def entries(self) -> list[dict[str, Any]]:
        """The journal's entries; one that is not a regular file of a journal's size is an UnreadableFile
        naming it (a FIFO would block the run forever)."""
        return tuneplan.parse_journal(read_journal(self.journal)) if self.journal.exists() else []

    def append(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, sort_keys=True, default=str, allow_nan=False)
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # A torn line from a killed append is skipped by the parser; start on a fresh line anyway.
            size = os.fstat(fd).st_size
            prefix = ""
            if size:
                with open(self.journal, "rb") as handle:
                    handle.seek(size - 1)
                    prefix = "" if handle.read(1) == b"\n" else "\n"
            os.write(fd, (prefix + line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def served(self, entries: list[dict[str, Any]]) -> config_store.ConfigFile:
        """The base with the journal's winners so far: what the runtime serves a job's launches as it starts.
        A key no config has yet is served its nearest, often an earlier job's winner; measured against the
        base alone, such a launch was kept when it beat Helion's default, though slower than what ran."""
        return replace(self.base, kernels=tuneplan.merge(self.base.kernels, tuneplan.accepted(entries, self.order)))

    def rebuild(self, entries: list[dict[str, Any]], current: config_store.ConfigFile
                ) -> tuple[config_store.ConfigFile, bool]:
        """The config file ``current`` with the journal's winners so far; and whether they differ from the base.
        The winners go over the file as it is now, not over the base: whatever else reached it since the run
        began (another run's winners, a fitted rule, a merged config PR) stays."""
        winners = tuneplan.accepted(entries, self.order)
        kernels = tuneplan.merge(current.kernels, winners)
        summary = tuneplan.summary(self.jobs, entries)
        complete = summary["ok"] == summary["jobs"]
        # The configs carry the environment they were tuned (or re-validated) under: the new one once
        # every job of a whole-suite plan finished, or when the file had none; else the old one stays, so
        # drift stays visible (a run over a few kernels says nothing of the others).
        stamp = (complete and self.opts.whole_suite) or not current.fingerprint
        fingerprint = self.opts.fingerprint if stamp else current.fingerprint
        spent = sum(float(e.get("seconds") or 0) for e in entries)
        # The runs before this one: not this run's own earlier saves (a resumed run saves again).
        before = [run for run in earlier_runs(current.tuned) if run.get("run") != self.id]
        tuned = {"date": datetime.date.today().isoformat(), "effort": self.opts.effort, "seed": self.opts.seed,
                 "budget_s": self.opts.budget_seconds, "tool": "mamba2-guard autotune", "run": self.id,
                 "seconds_spent": round(spent, 1), "jobs_ok": summary["ok"], "jobs_failed": summary["failed"],
                 "jobs": summary["jobs"], "searches_failed": tuneplan.failed_searches([*self.carried, *entries]),
                 "earlier": before}
        # The fitted selection and chain rules are the file's too: a re-tune keeps them (it fits none).
        cf = config_store.ConfigFile(fingerprint=dict(fingerprint), tuned=tuned, kernels=kernels,
                                     selection=current.selection)
        return cf, tuneplan.merge(self.base.kernels, winners) != tuneplan.merge(self.base.kernels, ())

    def save(self) -> bool:
        out = Path(self.opts.out)
        with self.lock, config_store.writing(out):
            cf, changed = self.rebuild(self.entries(), config_store.load(out) if out.exists() else self.base)
            config_store.save(out, cf)
            return changed


def read_journal(path: Path) -> str:
    """A journal's text, through the bounded reader; undecodable bytes become lines ``parse_journal`` skips."""
    return read_regular(path).decode(errors="replace")


def run_journals(state_dir: Path, gpu_slug: str) -> dict[Path, list[dict[str, Any]]]:
    """The journal entries of each autotune run for this GPU in ``state_dir``, by run directory, oldest first.
    A journal that cannot be read is left out with a warning: what is read from them are estimates, precautions
    and launches not to search again (``searched_before``)."""
    journals = sorted((state_dir / "autotune").glob(f"{_run_dir_name(gpu_slug, '*')}/journal.jsonl"),
                      key=lambda path: path.stat().st_mtime)
    runs = {}
    for path in journals:
        try:
            runs[path.parent] = tuneplan.parse_journal(read_journal(path))
        except (OSError, UnreadableFile) as exc:
            log.warning("%s: left out of the earlier runs: %s", path, getattr(exc, "strerror", None) or exc)
    return runs


def search_identity(plan: dict[str, Any], fingerprint: dict[str, Any]) -> str:
    """``tuneplan.search_identity`` of a run, over the sources of its fingerprint that shape generated code."""
    return tuneplan.search_identity(plan, {**fingerprint,
                                           "kernel_sources": kernel_shaping(fingerprint.get("kernel_sources") or {})})


def run_fingerprint(run_dir: Path, plan: dict[str, Any]) -> dict[str, Any] | None:
    """The environment a run recorded (``fingerprint.json``); for a run from before it did, the fingerprint of
    its output file when that hashes to the run's digest (the run stamped the file it started empty); else None."""
    path = run_dir / "fingerprint.json"
    if path.exists():
        recorded = load_json(path)
        return recorded if isinstance(recorded, dict) else None
    out = Path(str(plan.get("out") or ""))
    if out.is_file():
        stamped = config_store.load(out).fingerprint
        if stamped and fingerprint_hash(stamped) == plan.get("fingerprint_digest"):
            return dict(stamped)
    return None


def searched_before(run: Run, journals: dict[Path, list[dict[str, Any]]]) -> dict[Path, dict[str, Any]]:
    """The plans of this GPU's other runs (``journals``: ``run_journals``) that have ``run``'s search identity:
    their journals' searched launches are done for it (``tuned_elsewhere``), and the config file already holds
    what they decided. A run whose plan cannot be read, or that recorded no environment, is left out: its
    launches are searched. So is every run when ``--fresh`` starts this one over, and a run it set aside (its
    directory no longer named by its plan)."""
    if run.opts.fresh:
        return {}
    plans: dict[Path, dict[str, Any]] = {}
    for run_dir in journals:
        if run_dir == run.dir:
            continue
        try:
            plan = load_json(run_dir / "plan.json")
            fingerprint = run_fingerprint(run_dir, plan) if isinstance(plan, dict) else None
        except (OSError, ValueError, UnreadableFile) as exc:
            log.warning("%s: left out of the runs searched before: %s", run_dir, getattr(exc, "strerror", None) or exc)
            continue
        if (fingerprint is not None and run_dir.name == _run_dir_name(run.opts.gpu_slug, tuneplan.run_id(plan))
                and search_identity(plan, fingerprint) == run.identity):
            plans[run_dir] = plan
    return plans


DONE = "done"


class TunerProcess:
    """The child (``python -m mamba2_guard.flows.autotune_worker``) of one worker thread, serving its jobs one after
    another on one GPU. It is started on the first job, and again after a job that crashed it or hung
    (then killed, process group and all)."""

    def __init__(self, run_dir: Path, worker: int, device: str, children: set[subprocess.Popen]):
        self.log_path = run_dir / "logs" / f"worker-{worker}.log"
        self.device = device
        self.children = children
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        # mamba-ssm runs in a job only as the precision peer, so the choice its @triton.autotune makes can be
        # cached on disk (TRITON_CACHE_AUTOTUNING) instead of being re-benchmarked in every child.
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=self.device, PYTHONUNBUFFERED="1", TRITON_CACHE_AUTOTUNING="1")
        with open(self.log_path, "ab") as log:
            proc = spawn([sys.executable, "-m", "mamba2_guard.flows.autotune_worker", "--parent", str(os.getpid())],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=0, env=env,
                         cwd=str(PROJECT_ROOT))
        self.children.add(proc)
        return proc

    def _drop(self) -> None:
        if self.proc is not None:
            self.children.discard(self.proc)
            self.proc = None

    def run(self, spec_path: Path, timeout: float) -> str | int | None:
        """``DONE``; the exit code (negative: the signal) of a child the job ended; None on a timeout."""
        if self.proc is None or self.proc.poll() is not None:
            self._drop()
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # it died between jobs: the read below sees its end
            proc.stdin.write(f"{spec_path}\n".encode())
        ready, _, _ = select.select([proc.stdout], [], [], max(1.0, timeout))
        if not ready:
            kill_group(proc)
            self._drop()
            return None
        if proc.stdout.readline().startswith(DONE.encode()):
            return DONE
        rc = proc.wait()
        self._drop()
        return rc

    def close(self, grace: float = 10.0) -> None:
        """End of the worker's jobs: the child exits when its stdin closes."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
        self._drop()


def run_job(run: Run, job: Job, process: TunerProcess, worker: int, timeout: float, seconds_left: float | None,
            earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """One job in the worker's child process; returns its journal entry (decisions included). ``timeout`` kills
    it; ``seconds_left``, the run's budget left as it starts, is where its tuner defers launches
    (``tuneplan.attempt_limit``); ``earlier``, the journal's entries as the caller read them to start it: one
    view of the journal for every field of the spec."""
    opts = run.opts
    name = _safe(job.id)
    spec_path, result_path = run.dir / "jobs" / f"{name}.spec.json", run.dir / "jobs" / f"{name}.result.json"
    log_path = run.dir / "logs" / f"{name}.log"
    partial_path = run.dir / "jobs" / f"{name}.partial.json"
    result_path.unlink(missing_ok=True)
    partial_path.unlink(missing_ok=True)
    served_path = run.dir / "jobs" / f"{name}.served.yaml"  # the incumbents and the seeds' neighbours
    config_store.save(served_path, run.served(earlier))
    spec = {"job": job.to_dict(), "tuner": opts.tuner, "effort": opts.effort, "seed": opts.seed,
            "budget_seconds": opts.budget_seconds, "timeout_seconds": timeout, "seconds_left": seconds_left,
            "rounds": opts.rounds, "base_configs": str(served_path),
            "helion_benchmark_subprocess": (opts.helion_benchmark_subprocess
                                            or tuneplan.isolate_candidates(job.id, earlier)),
            "isolate_launches": tuneplan.isolated_launches(job.id, earlier),
            "isolate_kernels": sorted(run.faulted | tuneplan.faulted_kernels(earlier)),
            "result": str(result_path), "partial": str(partial_path), "log": str(log_path),
            "gpu_slug": opts.gpu_slug, "device": process.device,
            "worker": worker, "extra": opts.extra,
            "tuned_elsewhere": tuneplan.tuned_launches([*run.carried, *earlier]),
            "missing_only": opts.missing_only, "search": opts.search, "also_paths": dict(opts.also_paths),
            "criteria": opts.criteria.to_dict(),
            "env": {"HELION_AUTOTUNE_LOG": str(run.dir / "logs" / name)}}
    atomic_write(spec_path, json.dumps(spec, indent=1, sort_keys=True, default=str) + "\n")
    entry: dict[str, Any] = {"job": job.id, "kernel": job.kernel, "shape": job.shape, "index": job.index,
                             "worker": worker, "device": process.device, "log": str(log_path)}
    t0 = time.monotonic()
    answer = process.run(spec_path, timeout)
    entry["seconds"] = round(time.monotonic() - t0, 3)
    if answer is None:
        return {**entry, "status": tuneplan.FAILED, "reason": "timeout", **decided(partial_path, opts),
                "detail": f"hard timeout after {timeout:.0f}s; killed (log {log_path})"}
    if answer != DONE or not result_path.exists():
        tail = tail_of(log_path)
        why = signal_name(answer) if isinstance(answer, int) else "no result"
        return {**entry, "status": tuneplan.FAILED, "reason": "crash", **decided(partial_path, opts),
                "detail": f"worker {why}" + (f": {tail}" if tail else "") + f" (log {log_path})"}
    try:
        result = load_json(result_path)
    except (OSError, ValueError) as exc:  # a torn or foreign file: JSON, decoding and UnreadableFile errors
        return {**entry, "status": tuneplan.FAILED, "reason": "crash", "detail": f"unreadable result: {exc}"}
    launches = with_decisions(result.get("launches") or (), opts)
    return {**entry, "status": tuneplan.OK, "launches": launches, "tuner_seconds": result.get("seconds"),
            "setup_seconds": result.get("setup_seconds"), "process": result.get("process"), "gpu": result.get("gpu"),
            "tuned_elsewhere": result.get("tuned_elsewhere") or [], "had_config": result.get("had_config") or [],
            **({"minor": result["minor"]} if result.get("minor") else {}),
            **{name: result[name] for name in ("paths", "paths_error", "paths_seconds") if name in result},
            **({"deferred": result["deferred"]} if result.get("deferred") else {})}


def decided(partial_path: Path, opts: AutotuneOptions) -> dict[str, Any]:
    """The journal fields of a killed or crashed job from the worker's ``save_partial``: ``launches``, those
    it finished, each with its decision (none when it finished none or the file is unreadable), and
    ``in_flight``, the [kernel, key] it was searching, where the file names one."""
    try:
        partial = load_json(partial_path)
        launches = partial["launches"]
    except (OSError, ValueError, KeyError, TypeError):
        return {"launches": []}
    in_flight = partial.get("in_flight")
    return {"launches": with_decisions(launches, opts),
            **({"in_flight": [str(part) for part in in_flight]}
               if isinstance(in_flight, list) and len(in_flight) == 2 else {})}


def with_decisions(launches: Any, opts: AutotuneOptions) -> list[dict[str, Any]]:
    """Each launch record with its keep-or-reject decision under the run's criteria."""
    return [{**launch, "decision": tuneplan.decide(launch, opts.criteria).to_dict()} for launch in launches]


def describe(entry: dict[str, Any]) -> str:
    """One progress line per finished job: what became of each launch (of a failed job: those it finished)
    with its device time per call where the tuner measured it, and the job's wall seconds."""
    head = f"{entry['job']} ({float(entry.get('seconds') or 0):.0f} s)"
    parts = []
    for launch in entry.get("launches") or ():
        d = launch.get("decision") or {}
        verb = "kept" if d.get("keep") else "kept the default" if d.get("store_default") else "kept old"
        per_call = f" ({launch['device_ms']:.3f} ms per call)" if isinstance(launch.get("device_ms"), float) else ""
        parts.append(f"{launch.get('kernel')}[{launch.get('key')}]{per_call} {verb}: {d.get('reason')}")
    skipped = len(entry.get("tuned_elsewhere") or ())
    if skipped:
        parts.append(f"{skipped} launch(es) searched by an earlier job or run")
    had_config = len(entry.get("had_config") or ())
    if had_config:
        parts.append(f"{had_config} launch(es) with a config of their own (--missing-only)")
    if entry.get("minor"):
        parts.append(f"{len(entry['minor'])} minor launch(es) left to the configs of nearby keys searched earlier")
    if entry.get("deferred"):
        parts.append(f"{len(entry['deferred'])} launch(es) left to the next attempt (they would outlast the timeout)")
    for record in entry.get("paths") or ():
        parts.append(f"{record['stage']} fused {record['ms']['fused']:.3f} ms, chained {record['ms']['chain']:.3f} ms")
    if entry.get("paths_error"):
        parts.append(f"the paths were not timed: {entry['paths_error']}")
    if entry["status"] != tuneplan.OK:
        kept = f"; finished before: {'; '.join(parts)}" if parts else ""
        return f"{head}: FAILED ({entry.get('reason')}) {entry.get('detail', '')}{kept}"
    return f"{head}: " + ("; ".join(parts) if parts else "no Helion launches")


class AutotuneBusy(RuntimeError):
    """Another autotune run holds this state directory."""


def run_autotune(opts: AutotuneOptions, progress: Progress, on_job: Callable[[dict[str, Any]], None] | None = None,
                 on_start: Callable[[int, int], None] | None = None) -> AutotuneOutcome:
    """One autotune run; one at a time per state directory (a CLI run beside the nightly's re-tune would time
    its candidates on a busy GPU, and the two would write the config file in turns). AutotuneBusy otherwise."""
    with exclusive(Path(opts.state_dir) / "autotune.lock", AutotuneBusy, "autotune run"):
        return _run(opts, progress, on_job, on_start)


def _run(opts: AutotuneOptions, progress: Progress, on_job: Callable[[dict[str, Any]], None] | None,
         on_start: Callable[[int, int], None] | None) -> AutotuneOutcome:
    run = Run(opts, progress)
    entries = run.entries()
    todo = tuneplan.pending(run.jobs, entries, opts.max_attempts)
    done = len(run.jobs) - len(todo)
    progress(f"autotune run {run.id}: {len(run.jobs)} jobs, {done} already finished ({run.dir}); "
             f"{len(opts.devices)} worker(s) on CUDA_VISIBLE_DEVICES {', '.join(opts.devices)}")
    if on_start:
        on_start(len(run.jobs), done)
    # Job times of this GPU's runs (newest wins), to split the jobs longest first rather than round-robin;
    # and the kernels whose search faulted its child there, whose searches start isolated.
    journals = run_journals(Path(opts.state_dir), opts.gpu_slug)
    cost, sources = tuneplan.job_seconds(journals.values()), len(journals)
    run.faulted = tuneplan.faulted_kernels(entry for entries in journals.values() for entry in entries)
    carried = searched_before(run, journals)
    run.carried = [entry for run_dir in carried for entry in journals[run_dir]]
    # A job such a run finished only records its call here, unless this run captures other paths than that
    # one did: their launches are still to search, and a job expected to take its set-up alone was started in
    # a night's last seconds and killed mid-search.
    paths = run.plan.get("also_paths", {})
    finished_before = tuneplan.latest_by_job(entry for run_dir, plan in carried.items()
                                             if plan.get("also_paths", {}) == paths for entry in journals[run_dir])
    if run.carried:
        progress(f"{len(tuneplan.tuned_launches(run.carried))} launches searched by earlier runs of the same "
                 "search settings and kernel sources are not searched again")
    shards = tuneplan.assign(todo, len(opts.devices), cost, first=opts.first_shapes)
    if len(opts.devices) > 1:
        progress(f"split: longest first, by the job times of {sources} earlier run(s)" if cost else
                 "split: round-robin (no earlier run to take job times from)")
    deadline = time.monotonic() + opts.total_budget_seconds if opts.total_budget_seconds else None
    skipped: list[str] = []
    children: set[subprocess.Popen] = set()
    if entries:
        run.save()  # a resumed run: bring the file in step with the journal first

    def worker(index: int, jobs: list[Job]) -> None:
        process = TunerProcess(run.dir, index, opts.devices[index], children)
        try:
            for job in jobs:
                while True:
                    # A job starts only while the time it can be expected to take (its kernel's jobs' on this
                    # GPU, at least its tuning budget; a resumed one's launches left) still fits the overall
                    # budget, and its tuner defers the launches that would end past it: a job cut short would
                    # be killed mid-search and lose the launch in flight.
                    earlier = run.entries()
                    last = tuneplan.latest_by_job(earlier).get(job.id)
                    expected = tuneplan.expected_seconds(job, cost, opts.budget_seconds, last,
                                                         finished_before.get(job.id))
                    if deadline is not None and deadline - time.monotonic() < expected:
                        skipped.append(job.id)
                        break
                    entry = run_job(run, job, process, index, opts.job_timeout,
                                    None if deadline is None else deadline - time.monotonic(), earlier)
                    cost.update(tuneplan.job_seconds([[entry]]))  # the run's later jobs of the kernel expect it
                    run.append(entry)
                    run.save()
                    progress(describe(entry))
                    if not tuneplan.retry_now(job.id, run.entries(), opts.max_attempts):
                        if on_job:
                            on_job(entry)
                        break
                    progress(f"{job.id}: resuming its deferred launches" if tuneplan.deferred(entry) else
                             f"{job.id}: retrying with Helion's benchmarks in their own subprocess")
        finally:
            process.close()

    threads = [threading.Thread(target=worker, args=(i, shard), name=f"autotune-worker-{i}", daemon=True)
               for i, shard in enumerate(shards) if shard]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except BaseException:
        for proc in list(children):
            kill_group(proc, 1.0)
        raise
    entries = run.entries()
    changed = run.save() if entries else False
    summary = tuneplan.summary(run.jobs, entries)
    skipped = sorted(skipped, key=lambda j: run.order[j])
    if skipped:
        progress(f"overall budget spent: {len(skipped)} job(s) not started ({', '.join(skipped)}); "
                 "rerun the same command to resume")
    outcome = AutotuneOutcome(run.dir, Path(opts.out), run.jobs, entries, summary, bool(changed), bool(entries),
                              skipped)
    atomic_write(run.dir / "summary.json", json.dumps(outcome.to_dict(), indent=1, sort_keys=True) + "\n")
    return outcome


@contextlib.contextmanager
def rich_bar(enabled: bool):
    """(on_start, on_job, log) callbacks driving a rich progress bar on stderr (log prints above the bar);
    (None, None, None) when disabled."""
    if not enabled:
        yield None, None, None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("autotune"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=Console(stderr=True), transient=False)
    task = bar.add_task("", total=1)

    def on_start(total: int, done: int) -> None:
        bar.update(task, total=total, completed=done)

    def on_job(entry: dict[str, Any]) -> None:
        bar.update(task, advance=1, description=f"{entry['job']} {entry['status']}")

    with bar:
        yield on_start, on_job, bar.console.print


def rebaseline(kernels: Sequence[str], shapes: Sequence[str], state_dir: Path, progress: Progress,
               seed: int = 0, rounds: int = 30, path: Path | None = None) -> dict[str, Any]:
    """Bench the tuned kernels x shapes on every GPU of the host (sharded) and write them into
    ``baselines/<slug>.yaml``."""
    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.bench import shard
    from mamba2_guard.flows import baselines
    from mamba2_kernels import registry, suites

    fp = fingerprint.collect()
    loaded = suites.load()
    entries = [registry.get(k) for k in kernels]
    shape_specs = [loaded.shape(s) for s in shapes]
    result = shard.bench(entries, shape_specs, fingerprint=fp.to_dict(), fingerprint_digest=fp.digest(),
                         state_dir=state_dir, suite=None, seed=seed, rounds=rounds, progress=progress, workers="auto")
    path = path or baselines.path_for(fingerprint.gpu_slug(fp))
    left_out = baselines.update(path, result)
    bad = [f"{c.kernel}/{c.shape}" for c in result.cases if c.error or (c.precision and c.precision.ok is False)]
    return {"baseline": str(path), "left_out": left_out, "failed": bad}
