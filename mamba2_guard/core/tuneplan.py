"""The autotune run as data: the job list, its sharding over workers, resume from the journal, the
keep-or-reject decision for a winner, and the deterministic merge of results into the configs.

Pure: names, plain dicts and sample lists in, plain values out. No GPU, process, file or clock; the I/O
lives in ``mamba2_guard.flows.autotune`` (orchestrator) and ``mamba2_guard.flows.autotune_worker`` (one job
in a child process).

Vocabulary
----------
*job*      one registry kernel x one suite shape (``<kernel>@<shape>``), run in one child process. Inside,
           the public function is run once while its Helion launches are recorded; every distinct
           (Helion kernel, shape key) among them is one *launch* to tune.
*winner*   the autotuner's best config for one launch.
*incumbent* what the run-time lookup would use for that launch before this run: the committed config
           (``committed``: exact key, or ``nearest`` key) when the installed helion accepts it, else
           Helion's default config (``default``).
*journal*  one JSON line per finished job attempt (``journal.jsonl`` in the run directory): the
           source of truth for resume and for the config file, which is rebuilt from it after every job.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mamba2_guard.core import stats
from mamba2_guard.core.fingerprint_hash import fingerprint_hash

OK = "ok"
FAILED = "failed"
STATUSES = (OK, FAILED)
COMMITTED, NEAREST, DEFAULT = "committed", "nearest", "default"
INCUMBENTS = (COMMITTED, NEAREST, DEFAULT)


# The autotune settings' ranges, wherever they come from (guard.yaml, the CLI, the bring-up): the least value,
# and whether the least itself is allowed. Every number must also be finite: 1.0e+400 reads as infinity, and an
# infinite budget made every job report the overall budget spent.
SETTING_RANGES = {"budget_seconds": (0, False), "total_budget_seconds": (0, False), "job_timeout_seconds": (0, False),
                  "bringup_job_seconds": (0, False), "rounds": (2, True), "max_attempts": (1, True), "seed": (0, True)}


def setting_problem(name: str, value: Any) -> str | None:
    """Why ``value`` is no valid autotune setting ``name`` (``SETTING_RANGES``), or None; None is valid (the
    setting's default)."""
    if value is None:
        return None
    least, inclusive = SETTING_RANGES[name]
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < least or (value == least and not inclusive)):
        return f"expected a finite number {'>=' if inclusive else '>'} {least}, got {value!r}"
    return None


# ----------------------------------------------------------------------------------------------
# Jobs and sharding


@dataclass(frozen=True)
class Job:
    index: int  # position in the plan: the order of merging, whatever order jobs finish in
    kernel: str  # registry entry name
    shape: str  # suite shape name

    @property
    def id(self) -> str:
        return f"{self.kernel}@{self.shape}"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "kernel": self.kernel, "shape": self.shape, "id": self.id}


def plan_jobs(kernels: Sequence[str], shapes: Sequence[str]) -> list[Job]:
    """Shape-major (as ``bench``), each in the given order; duplicates dropped, first kept."""
    kernels = list(dict.fromkeys(kernels))
    shapes = list(dict.fromkeys(shapes))
    return [Job(i, k, s) for i, (s, k) in enumerate((s, k) for s in shapes for k in kernels)]


def assign(jobs: Sequence[Job], workers: int, cost: Mapping[str, float] | None = None,
           first: Sequence[str] = ()) -> list[list[Job]]:
    """Jobs to workers, each worker's list in plan order, but for the jobs at the shapes of ``first``, which
    start before the others, in that order (a priority of this run's, not part of its plan: the run's id and
    journal stay). Without ``cost``: static round-robin by plan index, job i to worker ``i % workers``, so
    neighbours in the plan (the same shape) spread over the GPUs.

    With ``cost`` (seconds per job id, from an earlier run): longest first. Jobs in decreasing cost (plan
    index breaks ties) each go to the worker with the least cost so far (the lower index breaks ties); a job
    without a known cost counts as the median known one. Round-robin gave one of two H200s both whole-call
    cases of a bench (161 s against 93 s). Either way deterministic: no dependence on this run's timing."""
    if workers < 1:
        raise ValueError(f"workers: expected >= 1, got {workers}")
    rank = {shape: i for i, shape in enumerate(dict.fromkeys(first))}

    def position(job: Job) -> tuple[int, int]:
        return rank.get(job.shape, len(rank)), job.index

    ordered = sorted(jobs, key=lambda j: j.index)
    shards: list[list[Job]] = [[] for _ in range(workers)]
    known = sorted(float(cost[j.id]) for j in ordered if cost and j.id in cost)
    if not known:
        for job in ordered:
            shards[job.index % workers].append(job)
        return [sorted(shard, key=position) for shard in shards]
    typical = known[len(known) // 2]
    weight = {j.id: float(cost[j.id]) if j.id in cost else typical for j in ordered}
    loads = [0.0] * workers
    for job in sorted(ordered, key=lambda j: (-weight[j.id], j.index)):
        target = min(range(workers), key=lambda w: (loads[w], w))
        shards[target].append(job)
        loads[target] += weight[job.id]
    return [sorted(shard, key=position) for shard in shards]


def run_id(plan: Mapping[str, Any]) -> str:
    """A short stable id of what a run is (jobs, effort, seed, environment digest, target): a rerun with
    the same plan resumes the same journal; any change starts a new one."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True, default=str).encode()).hexdigest()[:12]


# A run's plan fields that do not change what its searches find: which jobs there are and in what order,
# whether keys that have configs are searched, which other paths' launches are searched too, and the whole
# environment's digest (``search_identity`` takes the environment apart instead).
NOT_SEARCH_SETTINGS = frozenset({"jobs", "missing_only", "also_paths", "fingerprint_digest"})


def search_identity(plan: Mapping[str, Any], environment: Mapping[str, Any]) -> str:
    """What the searches of a run with ``plan`` depend on: its search settings (effort, seed, budget, criteria,
    tuner, GPU, output file) and ``environment``, a fingerprint whose ``kernel_sources`` are only the files
    that shape generated code. Runs of one identity search a (kernel, key) alike, so what one of them searched
    is done for the others (``tuned_launches`` over their journals): a new run after a change of its jobs'
    order, or of host code alone, does not search it again."""
    settings = {k: v for k, v in plan.items() if k not in NOT_SEARCH_SETTINGS}
    return fingerprint_hash({**{k: v for k, v in environment.items() if k != "kernels_source_hash"},
                             "search_settings": settings})


# ----------------------------------------------------------------------------------------------
# Journal and resume


def parse_journal(text: str) -> list[dict[str, Any]]:
    """Entries of a journal; a torn last line (a kill during the append), blank lines and lines that are no
    entry (nested too deeply to parse, for one) are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            entry = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("job"), str) and entry.get("status") in STATUSES:
            out.append(entry)
    return out


def latest_by_job(entries: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The last attempt of each job; an ``ok`` attempt is never replaced by a later failed one."""
    out: dict[str, Mapping[str, Any]] = {}
    for entry in entries:
        previous = out.get(entry["job"])
        if previous is not None and previous.get("status") == OK and entry.get("status") != OK:
            continue
        out[entry["job"]] = entry
    return out


def launches_by_job(entries: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Each job's launch records from all its attempts, the latest attempt's first. The worker saves each
    launch as it finishes, so an attempt that was killed or crashed keeps the launches it finished; its
    retry skips them (``tuned_launches``) and tunes only the rest."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for entry in reversed(list(entries)):
        out.setdefault(entry["job"], []).extend(entry.get("launches") or ())
    return out


def failed_attempts(entries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in entries:
        if entry.get("status") != OK:
            counts[entry["job"]] = counts.get(entry["job"], 0) + 1
    return counts


def deferred(entry: Mapping[str, Any] | None) -> bool:
    """Whether ``entry`` is an ``ok`` attempt that left launches to the next one (``defers``). It searched
    at least one launch, which the next attempt skips, so a job's deferring attempts end."""
    return bool(entry and entry.get("status") == OK and entry.get("deferred") and entry.get("launches"))


def pending(jobs: Sequence[Job], entries: Sequence[Mapping[str, Any]], max_attempts: int = 2) -> list[Job]:
    """Jobs still to run: those without an ``ok`` attempt, or whose ``ok`` attempt deferred launches, and
    with fewer than ``max_attempts`` failed ones. A finished job is never redone; a failed one is retried
    (at once, ``retry_now``, and by later runs) until the limit."""
    done = latest_by_job(entries)
    tries = failed_attempts(entries)
    out = []
    for job in jobs:
        last = done.get(job.id)
        if last is not None and last.get("status") == OK and not deferred(last):
            continue
        if tries.get(job.id, 0) >= max_attempts:
            continue
        out.append(job)
    return out


def isolate_candidates(job_id: str, entries: Iterable[Mapping[str, Any]]) -> bool:
    """Whether ``job_id``'s next attempt benchmarks every launch's candidates in Helion's own subprocess:
    after an attempt that crashed or hung in a launch it did not name (``isolated_launches`` has the rest).
    In the job's child a candidate that faults the GPU (an illegal address: chunk_scan at long-context on
    the H200 and the H100) ends the search, and the same seed would meet it again; isolated, the search
    outlives it at the cost of the subprocess's start."""
    return any(failed_in_flight(entry) and not entry.get("in_flight")
               for entry in entries if entry["job"] == job_id)


def isolated_launches(job_id: str, entries: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """The [kernel, key] launches whose search ``job_id``'s next attempt isolates: those in flight when an
    attempt crashed or hung (the worker's ``save_partial`` names it). Only they pay the subprocess's start,
    which took 15-20 s of every launch's search on the H200: an isolated retry of a whole call at
    long-context used to search one config per launch."""
    slots = {tuple(entry["in_flight"]) for entry in entries
             if entry["job"] == job_id and failed_in_flight(entry) and entry.get("in_flight")}
    return [list(slot) for slot in sorted(slots)]


def faulted_kernels(entries: Iterable[Mapping[str, Any]]) -> set[str]:
    """The kernels whose search was in flight when an attempt crashed (``entries`` of any runs of one GPU):
    a candidate that faults the GPU ends the child, and the same seeded search meets it again, at that key
    and at others, in the GPU's later runs too. Their searches start isolated in Helion's benchmark subprocess,
    which outlives the fault, for the cost of its start. A hang is not a fault: a job killed at its timeout
    names the launch it was searching too."""
    return {str(entry["in_flight"][0]) for entry in entries
            if entry.get("status") == FAILED and entry.get("reason") == "crash" and entry.get("in_flight")}


def failed_in_flight(entry: Mapping[str, Any]) -> bool:
    """An attempt that crashed or hung (not one whose tuner raised and answered)."""
    return entry.get("status") == FAILED and entry.get("reason") in {"crash", "timeout"}


def retry_now(job_id: str, entries: Sequence[Mapping[str, Any]], max_attempts: int = 2) -> bool:
    """Whether the worker reruns ``job_id`` at once: its last attempt deferred launches, or failed (crashed
    or hung) with attempts left. A failed one's rerun is isolated (``isolated_launches``), so a faulting
    candidate no longer ends the search; waiting for the next run would leave the job, and the config
    file's stamp, for another night."""
    mine = [e for e in entries if e.get("job") == job_id]
    if mine and deferred(mine[-1]):
        return True
    failed = [e for e in mine if e.get("status") == FAILED]
    return bool(mine) and mine[-1].get("status") == FAILED and len(failed) < max_attempts


def job_seconds(journals: Iterable[Iterable[Mapping[str, Any]]]) -> dict[str, float]:
    """Seconds per job id of the finished attempts in ``journals`` (oldest first: a later run's time
    replaces an earlier one's), the costs ``assign`` splits a new run by. An attempt that searched nothing,
    every launch tuned elsewhere, says nothing of the job's time and is left out."""
    out: dict[str, float] = {}
    for entries in journals:
        for entry in entries:
            seconds = entry.get("seconds")
            searched_nothing = not entry.get("launches") and entry.get("tuned_elsewhere")
            if entry.get("status") == OK and isinstance(seconds, int | float) and seconds > 0 and not searched_nothing:
                out[str(entry["job"])] = float(seconds)
    return out


def expected_seconds(job: Job, cost: Mapping[str, float], budget_seconds: float,
                     last: Mapping[str, Any] | None = None, before: Mapping[str, Any] | None = None) -> float:
    """How long ``job`` can be expected to run: its own time in an earlier run on this GPU (``cost``, from
    ``job_seconds``), else the median of its kernel's other jobs there, else its search budget; never less
    than the budget. A whole call's job searches a dozen launches and checks each, so it runs well past its
    search budget, often more than twice as long: started on the budget alone near a hard limit (a runner's
    job timeout), it is killed there with nothing kept, and a night's soft budget is overrun by as much.
    A job whose ``last`` attempt deferred launches (``defers``) resumes only those: it is expected to take
    that attempt's set-up and, for each launch left, the median time of the launches it searched. Expected
    to take the whole job again, it was not resumed in a night's last minutes that fitted those launches.
    A job that a run of the same search identity finished (``before``, its last attempt there) and this run
    has not tried searches none of those launches again: it records the call, as long as that attempt's set-up.
    Expected to search again, a guard upgrade's first night started none of a bring-up's finished jobs."""
    if last is None and before is not None and before.get("status") == OK and not deferred(before):
        return float(before.get("setup_seconds") or 0.0)
    if deferred(last):
        searched = [sum(float(launch.get(part) or 0.0) for part in LAUNCH_SECONDS) for launch in last["launches"]]
        return float(last.get("setup_seconds") or 0.0) + len(last["deferred"]) * statistics.median(searched)
    own = cost.get(job.id)
    if own is None:
        same_kernel = [seconds for job_id, seconds in cost.items() if job_id.split("@", 1)[0] == job.kernel]
        own = statistics.median(same_kernel) if same_kernel else 0.0
    return max(float(budget_seconds), float(own))


# The parts of a searched launch's time in a job's attempt (``flows.autotune_worker``'s record).
LAUNCH_SECONDS = ("incumbent_precision_seconds", "tune_seconds", "precision_seconds", "timing_seconds")


# ----------------------------------------------------------------------------------------------
# A job's launches: which to search first, and for how long


def search_order(device_ms: Sequence[float]) -> list[int]:
    """The indices of a job's launches, the one with the most device time per call first (ties, and
    launches whose time is unknown (NaN), in launch order, the unknown last). A whole call's costly
    kernels (the backward's dx and dCB) come late in launch order: searched in that order, a job cut at its
    timeout lost exactly them, and a budget split evenly gave a kernel of 1 % of the call as long a search
    as one of 20 %."""
    known = [i for i, ms in enumerate(device_ms) if not math.isnan(ms)]
    unknown = [i for i, ms in enumerate(device_ms) if math.isnan(ms)]
    return sorted(known, key=lambda i: -device_ms[i]) + unknown  # sorted() is stable: ties keep launch order


# A launch under this share of its job's device time is searched once per kernel and generated code in a run.
MINOR_SHARE = 0.05


def minor_launches(slots: Sequence[tuple[str, str]], device_ms: Sequence[float], searched: Iterable[Sequence[str]],
                   code: Callable[[str], Hashable]) -> list[int]:
    """The indices of a job's launches (``slots``: Helion kernel, key text) that it leaves to the config of a
    nearby key rather than search: each under ``MINOR_SHARE`` of the launches' device time (``device_ms``; any
    NaN: none is minor), of a kernel whose search at a key of the same ``code`` (the key's fields but its sizes:
    the same generated code up to the grid) an earlier job of the run ran (``searched``: [kernel, key] pairs).
    A search costs 20 s and more however small the launch (Helion compiles its whole seed population first),
    in every whole-call job of a run, where a gain at such a launch moves the call by a fraction of its small
    share; the key searched serves it as the nearest."""
    times = [float(ms) for ms in device_ms]
    total = sum(times)
    if not total > 0 or any(math.isnan(ms) for ms in times):
        return []
    covered = {(kernel, code(key)) for kernel, key in searched}
    return [i for i, ((kernel, key), ms) in enumerate(zip(slots, times, strict=True))
            if ms < MINOR_SHARE * total and (kernel, code(key)) in covered]


# Besides its search, a launch's turn in a job costs the incumbent's and the winner's precision (the first
# of an attempt also computes the fp64 and mamba-ssm references) and the keep-or-reject timing.
LAUNCH_CHECK_SECONDS = 30


def defers(elapsed: float, search_seconds: float, timeout: float | None, searched: int) -> bool:
    """Whether a job's attempt leaves its next launch, and those after it, to its next attempt: after
    ``elapsed`` seconds, the launch's search (``search_seconds``) and checks would not end within ``timeout``
    (``attempt_limit``; None: no limit). Started anyway past the job's hard timeout, the attempt is killed
    with the launch in flight, whose search is lost and whose retry pays for isolation; a whole call's dozen
    launches at the search's floor can outlast the timeout of its job. An attempt searches at least one launch
    (``searched``: those it already did), so a job's attempts end."""
    return bool(timeout) and searched > 0 and elapsed + search_seconds + LAUNCH_CHECK_SECONDS > float(timeout)


def attempt_limit(timeout: float | None, seconds_left: float | None) -> float | None:
    """The seconds within which an attempt's launches are to end (``defers``): the job's hard ``timeout`` or
    the run's budget left when the job started (``seconds_left``), whichever is sooner; None where neither is
    set. A job that started in a night's last minutes, on the time its kernel's jobs took, otherwise ran on
    past the night's budget to its own timeout, minutes later for a whole call; its launches past the budget
    are deferred instead, and resumed first by the next night (``expected_seconds``)."""
    limits = [float(limit) for limit in (timeout, seconds_left) if limit is not None]
    return min(limits) if limits else None


def launch_budget(seconds_left: float, device_ms: Sequence[float], floor: int = 20) -> int:
    """Seconds of search for the first of the launches still to search (``device_ms``, their device times per
    call, in search order), out of ``seconds_left``: its share of their time, at least ``floor``. Helion
    compiles the whole seed population before it benchmarks any: on the H200 a 10 s search of the dx kernel
    at long-context spent it compiling 21 seeds and ended with no config. Without the times (any NaN or
    none above 0) an even split."""
    times = [float(ms) for ms in device_ms]
    if not times:
        raise ValueError("launch_budget: expected the device times of at least one launch")
    total = sum(times)
    known = total > 0 and not any(math.isnan(ms) or ms < 0 for ms in times)
    share = times[0] / total if known else 1.0 / len(times)
    return max(floor, int(max(seconds_left, 0.0) * share))


def innermost_first(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """``config`` with each tiled loop launching its last-declared dimension fastest, or None where it
    already does or has no loop of two or more dimensions. Our kernels declare a grid outermost first
    ([batch, chunk, head or group, row block, column block]): the blocks of one chunk load the same states
    and inputs, and launched next to each other they find them in L2. Helion's default order launches the
    first dimension fastest, and its search changes the order only by random mutation, so it seldom tries
    this one. It is not faster everywhere (docs/kernels.md, "Launch order"): one more seed, for the search
    to measure."""
    orders = [list(order) for order in config.get("loop_orders") or []]
    flipped = [sorted(order, reverse=True) for order in orders]
    if flipped == orders or not any(len(order) > 1 for order in orders):
        return None
    return {**config, "loop_orders": flipped}


# ----------------------------------------------------------------------------------------------
# Keep or reject one winner


@dataclass(frozen=True)
class Criteria:
    """When a winner replaces the incumbent.

    * ``margin = 0.02``: against a committed config the winner must be at least 2 % faster by the
      median of interleaved samples; below that, churn in the config files is not worth a PR (and
      autotuner winners within 2 % are often the same config measured twice).
    * ``alpha = 0.01``: and the speed-up must be significant (two-sided Mann-Whitney on the paired
      interleaved samples, as the nightly's verdicts) with the whole one-sided ``confidence`` bound of
      the shift on the faster side: a noisy "win" is rejected, so a slower config is never shipped.
    * ``min_samples = 10``: fewer samples cannot reach such a p; the winner is then rejected.
    * against Helion's default config (no valid committed config) the winner only has to be no slower
      (median not above the default's): the run-time would otherwise use that default.
    """

    margin: float = 0.02
    alpha: float = 0.01
    confidence: float = 0.95
    min_samples: int = 10

    def __post_init__(self) -> None:
        if not (0 <= self.margin < 1):
            raise ValueError(f"autotune.margin: expected 0 <= margin < 1, got {self.margin!r}")
        if not (0 < self.alpha < 1):
            raise ValueError(f"autotune.alpha: expected 0 < alpha < 1, got {self.alpha!r}")
        if not (0.5 <= self.confidence < 1):
            raise ValueError(f"autotune.confidence: expected 0.5 <= confidence < 1, got {self.confidence!r}")
        if self.min_samples < 2:
            raise ValueError(f"autotune.min_samples: expected >= 2, got {self.min_samples!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"margin": self.margin, "alpha": self.alpha, "confidence": self.confidence,
                "min_samples": self.min_samples}


@dataclass(frozen=True)
class Decision:
    keep: bool
    reason: str
    effect: float | None = None  # median(candidate) / median(incumbent) - 1; negative = faster
    p_value: float | None = None
    upper: float | None = None  # upper confidence bound of that relative shift
    # The winner lost to Helion's default config, measured: the default is stored as the tuned config, so
    # the choice is on record (and stays if a later helion changes its default) and lookups stop falling back.
    store_default: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"keep": self.keep, "reason": self.reason, "effect": _finite(self.effect),
                "p_value": _finite(self.p_value), "upper": _finite(self.upper), "store_default": self.store_default}


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def decide(launch: Mapping[str, Any], criteria: Criteria = Criteria()) -> Decision:
    """Keep the launch's winner or keep the incumbent. ``launch`` is what the worker reports:
    ``config`` (the winner or None), ``error``, ``incumbent`` (kind), ``incumbent_config``,
    ``precision`` ({ok, detail}) of the public function run with the winner, ``incumbent_precision``
    (the same with the incumbent; absent for Helion's default) and ``samples_ms``
    {incumbent: [...], candidate: [...]} measured interleaved."""
    if launch.get("error"):
        return Decision(False, f"tuning failed: {launch['error']}")
    config = launch.get("config")
    if not isinstance(config, Mapping) or not config:
        return Decision(False, "no winner")
    incumbent = launch.get("incumbent") or DEFAULT
    if incumbent not in INCUMBENTS:
        return Decision(False, f"unknown incumbent kind {incumbent!r}")
    if incumbent == COMMITTED and dict(config) == dict(launch.get("incumbent_config") or {}):
        return Decision(False, "the winner is the committed config")
    precision = launch.get("precision") or {}
    if precision.get("ok") is not True:
        why = precision.get("detail") or "not checked"
        return Decision(False, f"precision: {why}")
    samples = launch.get("samples_ms") or {}
    c = stats.compare(samples.get("incumbent"), samples.get("candidate"), min_samples=criteria.min_samples,
                      confidence=criteria.confidence)
    base = {"effect": c.effect, "p_value": c.p_value, "upper": c.upper}
    wrong = launch.get("incumbent_precision") or {}
    if incumbent != DEFAULT and wrong.get("ok") is False:
        # A config that computes wrong results (after an upgrade) goes, whatever the winner's speed.
        return Decision(True, f"replaces the {incumbent} config, which fails precision now "
                              f"({wrong.get('detail') or 'see the record'})", **base)
    if c.effect is None:
        return Decision(False, "no timing samples")
    if incumbent == DEFAULT:
        if c.effect <= 0:
            than = "faster than" if c.effect < 0 else "as fast as"
            return Decision(True, f"{than} Helion's default config ({c.effect:+.1%})", **base)
        return Decision(False, f"slower than Helion's default config ({c.effect:+.1%}); the default is stored",
                        store_default=True, **base)
    if c.p_value is None:
        return Decision(False, f"too few samples to show a speed-up ({c.n_baseline}/{c.n_current})", **base)
    if c.effect > -criteria.margin:
        return Decision(False, f"{c.effect:+.1%} vs the {incumbent} config: not faster by the "
                               f"{criteria.margin:.0%} margin", **base)
    if c.p_value >= criteria.alpha:
        return Decision(False, f"{c.effect:+.1%} but not significant (p={c.p_value:.3g})", **base)
    if c.upper is None or c.upper >= 0:
        return Decision(False, f"{c.effect:+.1%} but the {criteria.confidence:.0%} bound reaches no change",
                        **base)
    return Decision(True, f"{c.effect:+.1%} vs the {incumbent} config (p={c.p_value:.2g})", **base)


# ----------------------------------------------------------------------------------------------
# Merge


@dataclass(frozen=True)
class Accepted:
    kernel: str  # Helion kernel name (the config-store section)
    key: str
    config: Mapping[str, Any]
    job: str


def accepted(entries: Iterable[Mapping[str, Any]], order: Mapping[str, int]) -> list[Accepted]:
    """What the jobs' attempts store, in plan order (a job's latest attempt first): kept winners; Helion's
    default where it beat the search; and a ``nearest`` incumbent that was not replaced, pinned under its own
    key (``pins_incumbent``). Unpinned, that key would follow its neighbour, which this run may change: on the
    H200 the long-context dstates launch kept nemotron3-nano's config and ran 18 % slower on nemotron3-nano's new
    one.

    A (kernel, key) tuned by several jobs (two entries launching the same Helion kernel at the same key)
    belongs to the first job in the plan that tuned it, kept or not, so the result never depends on which
    worker finished first, nor on whether a later job skipped it (``tuned_launches``)."""
    by_job = launches_by_job(entries)
    owners: dict[tuple[str, str], Accepted | None] = {}
    for job_id in sorted(by_job, key=lambda j: (order.get(j, math.inf), j)):
        for launch in by_job[job_id]:
            slot = (str(launch["kernel"]), str(launch["key"]))
            if not searched(launch) or slot in owners:
                continue
            decision = launch.get("decision") or {}
            stored = (launch.get("config") if decision.get("keep") else
                      launch.get("incumbent_config")
                      if decision.get("store_default") or pins_incumbent(launch) else None)
            owners[slot] = Accepted(slot[0], slot[1], dict(stored), job_id) if stored else None
    return [a for a in owners.values() if a is not None]


def pins_incumbent(launch: Mapping[str, Any]) -> bool:
    """Whether a launch that kept no winner pins its incumbent under its own key: a ``nearest`` one, unless it
    failed precision here. A search that fails after such a check (its winners fail it too, or none ran) would
    otherwise write a config known to compute wrong results under the key, where the runtime serves it
    unquestioned and no later stage searches it (a key with a config of its own)."""
    return launch.get("incumbent") == NEAREST and (launch.get("incumbent_precision") or {}).get("ok") is not False


def searched(launch: Mapping[str, Any]) -> bool:
    """Whether the tuner ran a search for this launch: it returned a winner, or the search itself failed.
    A failed search (NoConfigFound: the gated RMSNorm backward's candidates compile for longer than a
    10 s budget) fails again with the same seed and budget, so the whole-call jobs do not repeat it: on
    the H200 they spent 117 s doing so for nothing."""
    return bool(launch.get("config") or launch.get("error"))


def failed_searches(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """``kernel[key]: error type`` of each launch whose search or validation failed in the jobs' attempts,
    sorted: the old config stays there, and a reviewer should know that nothing was tried."""
    out = set()
    for launches in launches_by_job(entries).values():
        for launch in launches:
            if launch.get("error"):
                out.add(f"{launch['kernel']}[{launch['key']}]: {str(launch['error']).split(':')[0]}")
    return sorted(out)


def tuned_launches(entries: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """The (Helion kernel, key) pairs that jobs already searched (finished launches of killed attempts
    too), sorted. A retry skips them, and so does a later job (a whole call launches the same kernels as
    the per-kernel jobs before it): its result for them would lose the merge to the earlier job anyway."""
    slots = {(str(launch["kernel"]), str(launch["key"]))
             for launches in launches_by_job(entries).values() for launch in launches if searched(launch)}
    return [list(slot) for slot in sorted(slots)]


def merge(base: Mapping[str, Mapping[str, Mapping[str, Any]]] | None,
          winners: Iterable[Accepted]) -> dict[str, dict[str, dict[str, Any]]]:
    """The ``kernels`` section: the committed one with the accepted winners written over it."""
    out = {k: {key: dict(cfg) for key, cfg in v.items()} for k, v in (base or {}).items()}
    for w in winners:
        out.setdefault(w.kernel, {})[w.key] = dict(w.config)
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def summary(jobs: Sequence[Job], entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts for the report: jobs ok / failed / not run, winners kept / rejected."""
    latest = latest_by_job(entries)
    ok = [j for j in jobs if (latest.get(j.id) or {}).get("status") == OK]
    failed = [j for j in jobs if (latest.get(j.id) or {}).get("status") == FAILED]
    kept = rejected = 0
    for launches in launches_by_job(entries).values():
        for launch in launches:
            if (launch.get("decision") or {}).get("keep"):
                kept += 1
            else:
                rejected += 1
    return {"jobs": len(jobs), "ok": len(ok), "failed": len(failed), "not_run": len(jobs) - len(ok) - len(failed),
            "kept": kept, "rejected": rejected, "failed_jobs": [j.id for j in failed]}
