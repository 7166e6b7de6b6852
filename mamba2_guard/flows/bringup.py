"""A new GPU's bring-up: ``mamba2-guard bring-up`` in the foreground, and the nightly cycle by itself.

The stages and their order are ``mamba2_guard.core.bringup``'s. Each search stage is one autotune run
(``mamba2_guard.flows.autotune``: child processes, a hard timeout per job, a journal fsynced after every
job, the config file rewritten atomically after every job), so a kill loses at most the job in flight, and
the next run of the same stage resumes its journal. The fit stage measures the grid shape by shape into a
file of its own and fits once every shape is in it.

State: ``<state>/bringup/<gpu-slug>.json`` (written atomically after every stage run): each stage's status,
jobs done and seconds, and what the report, the PR body and the metrics show (``core.bringup.progress``).
A run stops when its budget (a night's) cannot start another job; the next run goes on where it stopped.
After every stage run that changed the config file, ``on_configs`` is called (the nightly opens or updates
the GPU's one config PR there), so the PR holds validated winners from the first night on.

The withheld-file mode (``--withhold-configs``) runs all of it on a GPU that has a file of its own, as if the
GPU were new: the slug becomes ``<slug>-withheld`` (``MAMBA2_GUARD_GPU_SLUG``) and no other GPU's file serves
or seeds it (``MAMBA2_GUARD_BORROW=0``), in this process and the tuners it starts.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mamba2_guard.core import bringup, tuneplan
from mamba2_guard.flows import autotune
from mamba2_kernels import config_store
from mamba2_kernels.files import UnreadableFile, atomic_write, load_json
from mamba2_kernels.ssd import forcing

Progress = Callable[[str], None]
WHOLE_CALL = "ssd_combined_fwd_bwd"
SUITE, ZOO, GRID = "default", ("zoo-fit", "zoo-steered"), "selection-grid"
# A bring-up job searches longer than the warm re-tune's 10 s: Helion's quick effort needs about a minute per
# kernel to leave its default config far behind, and a whole call holds about a dozen launches.
DEFAULT_JOB_BUDGET_SECONDS = 120.0
# A nominal device (bytes/s, FLOP/s) for ordering shapes by the whole call's roofline time: only the order of
# the shapes matters, and it is the same on any GPU whose bandwidth-to-compute ratio is near this one's.
NOMINAL_BANDWIDTH, NOMINAL_FLOPS = 4.0e12, 7.0e14
# A stage's ``also_path`` as the fused stages its jobs force to it (``core.bringup``'s docstring): the state
# passes run fused until a chain rule says otherwise, the fusions chained until a fuse rule does.
ALSO_PATHS = {"chain": {stage: "chain" for stage in forcing.STAGES if stage not in forcing.FUSE_STAGES},
              "fused": {stage: "fused" for stage in forcing.FUSE_STAGES}}


def state_path(state_dir: Path, gpu_slug: str) -> Path:
    return Path(state_dir) / "bringup" / f"{gpu_slug}.json"


def load_state(state_dir: Path, gpu_slug: str) -> dict[str, Any] | None:
    """The bring-up's state, or None before one started. A file that is not the state's JSON is an error
    naming it (it is only ever written atomically, so it was written by someone else)."""
    path = state_path(state_dir, gpu_slug)
    if not path.is_file():
        return None
    try:
        state = load_json(path)
    except (UnicodeDecodeError, json.JSONDecodeError, UnreadableFile) as exc:
        raise ValueError(f"{path}: not a bring-up state file ({exc})") from None
    if not isinstance(state, dict) or not isinstance(state.get("stages"), dict):
        raise ValueError(f"{path}: not a bring-up state file (expected an object with 'stages')")
    return state


def withhold_configs() -> str:
    """Switch this process (and the tuners it starts) to the withheld-file mode; returns the slug it runs as."""
    from mamba2_guard.adapters import fingerprint

    os.environ.pop(config_store.SLUG_ENV, None)
    gpu_slug = f"{fingerprint.gpu_slug(fingerprint.collect())}-withheld"
    os.environ[config_store.SLUG_ENV] = gpu_slug
    os.environ[config_store.BORROW_ENV] = "0"
    return gpu_slug


def known_kernels() -> set[str]:
    """Every Helion kernel the registry's entries launch."""
    from mamba2_kernels import registry

    return registry.tuned_kernel_names()


def missing(config_path: Path) -> list[str]:
    """The suite's Helion kernels that a GPU's own file holds no config of (all of them: no file)."""
    own = config_store.load(config_path) if Path(config_path).is_file() else None
    return bringup.missing_kernels(own.kernels if own else None, known_kernels())


def is_due(state_dir: Path, gpu_slug: str, config_path: Path) -> bool:
    """Whether ``gpu_slug`` (whose own file is ``config_path``) needs a bring-up, or has one in progress."""
    return bringup.due(missing(config_path), load_state(state_dir, gpu_slug))


def call_key(shape: Any) -> config_store.ShapeKey:
    """The fields of ``shape`` (a suite's ``ShapeSpec``) that the whole call's launch keys are made of, as one
    key in the config store's terms: the distance between two of them is how badly a config tuned at one
    shape's launches is expected to serve the other's (``core.bringup.by_reach``)."""
    return config_store.ShapeKey.of(
        tokens=config_store.tokens_bucket(shape.batch * shape.seqlen), hpg=shape.nheads // shape.ngroups,
        headdim=shape.headdim, dstate=shape.dstate, chunk_size=shape.chunk_size, dtype=shape.dtype,
        dt=shape.dt_dtype or shape.dtype, z=int(shape.z), seq=int(shape.docs > 1), init=int(shape.initial_states),
        D="hp" if shape.d_per_dim else "h")


def roofline_ms(entry: Any, shape: Any) -> float:
    """The whole call's time at ``shape`` on the nominal device: what orders the shapes by value."""
    return 1e3 * max(entry.bytes_moved(shape) / NOMINAL_BANDWIDTH, entry.flops(shape) / NOMINAL_FLOPS)


def _resumable(state: dict[str, Any] | None, config_path: Path) -> dict[str, Any] | None:
    """``state`` (as loaded), unless it is complete and its GPU lacks kernels added since it began: then None,
    a new bring-up for them starts."""
    if state and bringup.complete(state) and bringup.added_since(missing(config_path), state):
        return None
    return state


def current_state(state_dir: Path, gpu_slug: str, config_path: Path) -> dict[str, Any] | None:
    """The state the next run resumes: None before a bring-up began, and after a complete one whose GPU lacks
    kernels added since it began."""
    return _resumable(load_state(state_dir, gpu_slug), config_path)


def _tuned_before(state: dict[str, Any] | None, config_path: Path) -> bool:
    if state:
        return bool(state.get("tuned_before"))
    return Path(config_path).is_file() and bool(config_store.load(config_path).kernels)


def tuned_before(state_dir: Path, gpu_slug: str, config_path: Path) -> bool:
    """Whether ``gpu_slug``'s own file held configs when its bring-up began: as its state recorded it, or, before
    one began, as the file is now."""
    return _tuned_before(current_state(state_dir, gpu_slug, config_path), config_path)


def _set_aside(path: Path, state: dict[str, Any]) -> None:
    """Keep a complete bring-up's state beside the new one's, as ``<slug>.<started>.json`` (a rename: atomic)."""
    started = "".join(ch for ch in str(state.get("started", "")) if ch.isalnum())[:15] or "earlier"
    path.rename(path.with_name(f"{path.stem}.{started}.json"))


def call_speedups(cases: Iterable[Any]) -> dict[str, float]:
    """The whole call's speedup against mamba-ssm per shape in a bench's ``cases`` (``CaseResult``), for
    ``BringUpOptions.call_speedups``; a shape measured twice keeps the later."""
    return {case.shape: case.speedup for case in cases if case.kernel == WHOLE_CALL and case.speedup}


def stages_for(gpu_slug: str, tuned: bool = False) -> list[bringup.Stage]:
    from mamba2_kernels import registry, suites

    loaded = suites.load()
    call = registry.get(WHOLE_CALL)
    suite, zoo = loaded.suite(SUITE), [s for name in ZOO for s in loaded.suite(name)]
    grid = loaded.suite(GRID)
    weight = {s.name: roofline_ms(call, s) for s in [*suite, *zoo, *grid]}
    keys = {s.name: call_key(s) for s in [*suite, *zoo, *grid]}
    return bringup.plan(whole_call=WHOLE_CALL, suite_kernels=[e.name for e in registry.select() if e.has_helion],
                        suite_shapes=[s.name for s in suite], zoo_shapes=[s.name for s in zoo],
                        grid_shapes=[s.name for s in grid], weight=weight,
                        distance=lambda a, b: keys[a].distance(keys[b]),
                        other_files=bool(config_store.other_gpu_files(gpu_slug)), tuned_before=tuned)


@dataclass
class BringUpOptions:
    state_dir: Path
    gpu_slug: str
    budget_seconds: float  # this run's (a night's): a stage's job starts only while its expected time fits
    fingerprint: dict[str, Any] = field(default_factory=dict)
    fingerprint_digest: str = ""
    out: Path | None = None  # the config file (default: the GPU's in the config store)
    job_budget_seconds: float = DEFAULT_JOB_BUDGET_SECONDS
    tuning: dict[str, Any] = field(default_factory=dict)  # more AutotuneOptions fields (effort, seed, criteria)
    devices: Sequence[str] = ("0",)
    tuner: str = autotune.DEFAULT_TUNER
    fit_rounds: int = 10
    until: str | None = None  # stop after this stage (None: run them all)
    stages: Sequence[bringup.Stage] | None = None  # the plan (default: ``stages_for`` the GPU)
    measure: Callable[..., Any] | None = None  # the fit stage's measurement (tests); default selection_measure.measure
    # the whole call's latest speedup against mamba-ssm per shape (the night's bench): below 1.0x goes first
    call_speedups: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Each is checked as the guard config's setting it comes from; neither may be left out here.
        checks = (("budget_seconds", "total_budget_seconds"), ("job_budget_seconds", "bringup_job_seconds"))
        for name, setting in checks:
            value = getattr(self, name)
            problem = tuneplan.setting_problem(setting, value) if value is not None else "expected a number, got None"
            if problem:
                raise ValueError(f"{name}: {problem}")

    @property
    def config_path(self) -> Path:
        return Path(self.out) if self.out else config_store.path_for(self.gpu_slug)


# The guard config's autotune settings a bring-up's searches take (its budgets are the bring-up's own).
TUNING_SETTINGS = ("effort", "seed", "rounds", "max_attempts", "criteria", "helion_benchmark_subprocess")


def options_from_config(cfg: Any, *, job_budget_seconds: float | None = None, **fields: Any) -> BringUpOptions:
    """``BringUpOptions`` with the guard config's settings: its searches' (``TUNING_SETTINGS``) and the job
    budget (``autotune.bringup_job_seconds``) unless ``job_budget_seconds`` overrides it; ``fields`` the rest."""
    settings = autotune.config_options(cfg)
    budget = job_budget_seconds or float(cfg.autotune_value("bringup_job_seconds", DEFAULT_JOB_BUDGET_SECONDS))
    return BringUpOptions(job_budget_seconds=budget, tuning={k: settings[k] for k in TUNING_SETTINGS}, **fields)


@dataclass
class BringUpOutcome:
    state: dict[str, Any]
    runs: list[dict[str, Any]]  # each stage run: stage, run directory, summary, changed
    stopped: str | None  # why this run stopped before the end (None: complete)

    @property
    def complete(self) -> bool:
        return bringup.complete(self.state)

    @property
    def changed(self) -> bool:
        return any(run.get("changed") for run in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {"complete": self.complete, "changed": self.changed, "stopped": self.stopped, "runs": self.runs,
                "progress": bringup.progress(self.state)}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_bring_up(opts: BringUpOptions, progress: Progress,
                 on_configs: Callable[[dict[str, Any]], None] | None = None,
                 on_job: Callable[[dict[str, Any]], None] | None = None,
                 speedups: Sequence[float] = ()) -> BringUpOutcome:
    """Run the stages due, in order, within ``opts.budget_seconds``; resumable (module docstring).
    ``on_configs`` gets the progress (with ``speedups``, the whole calls' latest against mamba-ssm) after
    every stage run that changed the config file."""
    path = state_path(opts.state_dir, opts.gpu_slug)
    earlier = load_state(opts.state_dir, opts.gpu_slug)
    state = _resumable(earlier, opts.config_path)
    if earlier and state is None:
        _set_aside(path, earlier)  # complete, and kernels were added since: a bring-up of its own for them
    tuned = _tuned_before(state, opts.config_path)
    stages = list(opts.stages) if opts.stages is not None else stages_for(opts.gpu_slug, tuned)
    state = state or bringup.new_state(opts.gpu_slug, stages, _now(), tuned, known_kernels())
    state.setdefault("stages", {})
    for stage in stages:  # a plan grown since the state was written (a new zoo shape) gets its new stages
        state["stages"].setdefault(stage.name, bringup.stage_state(stage))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(state, indent=1, sort_keys=True) + "\n")
    deadline = time.monotonic() + opts.budget_seconds
    runs: list[dict[str, Any]] = []
    stopped = None
    for stage in stages:
        if state["stages"][stage.name]["status"] in bringup.FINISHED:
            if stage.name == opts.until:  # a later run with the same --until goes no further either
                stopped = f"stage {stage.name} is done; stopped there, as asked"
                break
            continue
        left = deadline - time.monotonic()
        progress(f"bring-up {opts.gpu_slug}: stage {stage.name} ({stage.why}): {stage.jobs} jobs, "
                 f"{left / 60:.1f} minutes of budget left")
        if stage.search == bringup.FITTED:
            run = _fit(opts, stage, deadline, progress, spent=float(state["stages"][stage.name]["seconds"]))
        else:
            if left <= 0:  # the search starts each job only while it can be expected to fit (a resumed one too)
                stopped = f"budget spent before stage {stage.name}; the next run resumes it"
                break
            run = _search(opts, stage, left, progress, on_job)
        runs.append(run)
        state = bringup.record(state, stage.name, status=run["status"], done=run["done"], seconds=run["seconds"],
                               now=_now(), run=run.get("run_dir"))
        atomic_write(path, json.dumps(state, indent=1, sort_keys=True) + "\n")
        if run.get("changed") and on_configs is not None:
            on_configs(bringup.progress(state, speedups))
        if run["status"] not in bringup.FINISHED:
            stopped = f"budget spent in stage {stage.name}; the next run resumes it"
            break
        if stage.name == opts.until:
            stopped = f"stopped after stage {stage.name}, as asked"
            break
    summary = bringup.progress(state)
    progress(f"bring-up {opts.gpu_slug}: stage {summary['stage']}, {summary['jobs_done']} jobs done, "
             f"{summary['jobs_left']} left, {summary['seconds'] / 60:.1f} minutes spent"
             + (f"; {stopped}" if stopped else ""))
    return BringUpOutcome(state, runs, stopped)


def _search(opts: BringUpOptions, stage: bringup.Stage, left: float, progress: Progress,
            on_job: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    fields = {"effort": "quick", "seed": 1234, **opts.tuning}
    first = bringup.below_par(stage.shapes, opts.call_speedups)
    if first:
        progress(f"stage {stage.name}: first the calls measured below mamba-ssm's: "
                 + ", ".join(f"{shape} ({opts.call_speedups[shape]:.2f}x)" for shape in first))
    options = autotune.AutotuneOptions(
        kernels=list(stage.kernels), shapes=list(stage.shapes), out=opts.config_path, state_dir=Path(opts.state_dir),
        gpu_slug=opts.gpu_slug, fingerprint=opts.fingerprint, fingerprint_digest=opts.fingerprint_digest,
        budget_seconds=opts.job_budget_seconds, total_budget_seconds=left, devices=list(opts.devices),
        tuner=opts.tuner, missing_only=stage.missing_only, whole_suite=False,
        search="borrowed" if stage.search == bringup.BORROWED else "helion", first_shapes=first,
        also_paths=ALSO_PATHS[stage.also_path] if stage.also_path else {}, **fields)
    outcome = autotune.run_autotune(options, progress, on_job=on_job)
    left_over = tuneplan.pending(outcome.jobs, outcome.entries, options.max_attempts)
    finished = not outcome.skipped and not left_over
    done = len(outcome.jobs) - len(left_over)
    rule_changed = stage.also_path is not None and _provisional_rule(opts, outcome.entries, outcome.run_dir,
                                                                      progress)
    return {"stage": stage.name, "status": bringup.DONE if finished else bringup.PARTIAL, "done": done,
            "seconds": sum(float(entry.get("seconds") or 0) for entry in outcome.entries),
            "run_dir": str(outcome.run_dir), "summary": outcome.summary,
            "changed": outcome.changed or rule_changed}


def _provisional_rule(opts: BringUpOptions, entries: Sequence[Mapping[str, Any]], run_dir: Path,
                      progress: Progress) -> bool:
    """Fit the path rules of the fused stages its jobs timed (the state passes' chain rules, or the fusions' fuse
    rules) on the two paths' timings of a stage's jobs so far (``entries``, its run's journal: each job's
    latest), into the config file: until the fit stage's rule replaces it, a call runs the path that was faster
    at the searched shapes nearest it. Returns whether the rules changed."""
    from mamba2_guard.flows import selection_measure

    latest = tuneplan.latest_by_job(entries)
    records = [record for entry in latest.values() for record in entry.get("paths") or ()]
    if not records or not opts.config_path.is_file():
        return False
    before = config_store.load(opts.config_path).selection
    fits = selection_measure.fit_records_into(opts.config_path, records, Path(run_dir) / "journal.jsonl")
    for fit in fits:
        progress(f"provisional {fit.describe()}")
    return config_store.load(opts.config_path).selection != before


def _fit(opts: BringUpOptions, stage: bringup.Stage, deadline: float, progress: Progress, spent: float
         ) -> dict[str, Any]:
    """Measure the grid shape by shape while the budget lasts (a shape measured is kept in the file), then
    fit the rule into the config file once every shape is in. ``spent``: the stage's seconds before."""
    t0 = time.monotonic()

    def ran(**fields: Any) -> dict[str, Any]:
        return {"stage": stage.name, "seconds": spent + time.monotonic() - t0, **fields}

    from mamba2_guard.flows import selection_measure

    measure = opts.measure or selection_measure.measure
    measurements = state_path(opts.state_dir, opts.gpu_slug).with_suffix(".selection.jsonl")
    earlier = selection_measure.read_records(measurements) if measurements.exists() else []
    measured = {record.get("shape") for record in earlier}
    for shape in stage.shapes:
        if shape in measured:
            continue
        if time.monotonic() >= deadline:
            return ran(status=bringup.PARTIAL, done=len(measured), changed=False)
        measure([shape], config=opts.config_path, seed=0, rounds=opts.fit_rounds, processes=2, out=measurements)
        measured.add(shape)
        progress(f"bring-up fit: measured {shape} ({len(measured)}/{len(stage.shapes)})")
    fits = selection_measure.fit_into(opts.config_path, measurements)
    for fit in fits:
        progress(fit.describe())
    return ran(status=bringup.DONE, done=len(stage.shapes), changed=bool(fits), measurements=str(measurements))
