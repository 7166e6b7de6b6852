"""The autotune child process: ``python -m mamba2_guard.flows.autotune_worker [--parent PID]``.

The orchestrator (``mamba2_guard.flows.autotune``) starts one per worker thread, in its own session with
``CUDA_VISIBLE_DEVICES`` set to that worker's GPU, and sends it jobs one at a time: the path of a job's
spec JSON on a line of stdin. The child runs the job (its output, Helion's and Triton's included, goes to
the job's own log), writes the tuner's result atomically to ``spec["result"]`` and answers ``done`` on its
stdout. It serves jobs until stdin closes, so imports, the CUDA context, compiled kernels and mamba-ssm's
autotune picks are paid once per worker, not once per job. The orchestrator's hard timeout still holds
per job: a job that crashes the child or hangs costs that job only (the orchestrator kills the process
group and starts a fresh child for the next job). A tuner that raises ends the child too: a CUDA error
can leave the context unusable for the jobs after it. If the orchestrator dies (kill -9), a watch thread
kills this process group, Helion's own benchmark workers included.

The spec names the tuner (``module:function`` or ``/path/file.py:function``; tests pass a fake one), the
job and the settings; the tuner returns ``{"launches": [...]}`` (see ``mamba2_guard.core.tuneplan.decide`` for a
launch's fields), and saves those it finished so far with ``save_partial`` as it goes.

``helion_tuner`` is the real tuner: on the GPU it records the Helion launches of the job's public function (with
``spec["also_paths"]``, also those a call with those fused stages forced to their other path adds, each searched,
checked and timed on its path) and times each on its current config; then, for each distinct (kernel, shape key)
that no earlier job of the run tuned (``spec["tuned_elsewhere"]``: whole-call jobs reach the per-kernel jobs'
launches), the costliest first, but those it leaves to the config of a nearby key as minor
(``mamba2_guard.core.tuneplan.minor_launches``), it runs Helion's autotuner (effort, recorded random seed, the job's
budget split by the launches' device times, warm-started from the config that ``spec["base_configs"]`` serves the
launch (the run's base with the winners of the jobs before this one) where the installed helion still accepts it,
from it with its innermost tiles launched first, from the kernel's configs at other keys and from its seed
configs), then measures what the keep-or-reject decision needs: the public function's precision with the winner
(against mamba-ssm and fp64, the bench's criterion) and the public function on the winner against it on the
incumbent, interleaved (``mamba2_guard.bench.timing.Timer``), so that host-side work the config changes counts. A
launch whose search would end past the job's hard timeout (``spec["timeout_seconds"]``), or past the run's budget
left as the job started (``spec["seconds_left"]``), is not started: it and those after it are returned as
``deferred``, for the job's next attempt. Each launch records its device time and the seconds of each phase (tune,
precision, timing), the job those of its set-up. A job with ``also_paths`` that searched all its launches then
times the whole call with each of those stages forced each way, on its winners (``paths``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from mamba2_guard.adapters.processes import watch_parent
from mamba2_kernels.files import atomic_write
from mamba2_kernels.ssd import forcing

# Added to an isolated launch's search: Helion's benchmark subprocess starts inside the search's budget, and
# took 15-20 s of it on the H200 (a 27 s search then benchmarked one config).
ISOLATION_START_SECONDS = 20


def load_tuner(ref: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The tuner named by ``module:function`` or ``/path/file.py:function``."""
    from mamba2_kernels.targets import load_target

    return load_target(ref)


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """stdout and stderr of this process (fds 1 and 2: compilers' and Helion's output too) into ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for handle in (fd, *saved):
            os.close(handle)


def run_one(spec: dict[str, Any], job_number: int, started: float) -> None:
    """One job: the tuner on the spec, its result written atomically to ``spec["result"]``."""
    os.environ.update(spec.get("env") or {})
    t0 = time.monotonic()
    tuner = load_tuner(spec["tuner"])
    result = dict(tuner(spec) or {})
    result.setdefault("launches", [])
    result["seconds"] = round(time.monotonic() - t0, 3)
    result["process"] = {"pid": os.getpid(), "job_number": job_number,
                         "age_seconds": round(t0 - started, 3)}  # 0 for the first job: it paid the imports
    atomic_write(Path(spec["result"]), json.dumps(result, sort_keys=True, default=str, allow_nan=False) + "\n")


def save_partial(spec: dict[str, Any], launches: list[dict[str, Any]], in_flight: list[str] | None = None) -> None:
    """The launches a tuner finished so far, written atomically to ``spec["partial"]`` after each one and
    with the [kernel, key] it searches next (``in_flight``) before it starts: a job killed at its timeout (or
    crashed by a candidate) keeps the finished ones, and its retry isolates the one in flight alone."""
    if spec.get("partial"):
        atomic_write(Path(spec["partial"]), json.dumps({"launches": launches, "in_flight": in_flight},
                                                       sort_keys=True, default=str, allow_nan=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mamba2_guard.flows.autotune_worker",
                                     description="run autotune jobs whose spec paths arrive on stdin")
    parser.add_argument("--parent", type=int, help="exit with the process group when this pid is gone")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.parent:
        watch_parent(args.parent, interval_s=0.2)
    started = time.monotonic()
    answers = os.dup(1)
    os.dup2(2, 1)  # stray prints go to the worker log, never into the answers
    for number, line in enumerate(sys.stdin, start=1):
        spec_path = Path(line.strip())
        spec = json.loads(spec_path.read_text())
        with _output_to(Path(spec["log"])):
            try:
                run_one(spec, number, started)
            except Exception:
                traceback.print_exc()
                return 1
        os.write(answers, f"done {spec_path}\n".encode())
    return 0


# ----------------------------------------------------------------------------------------------
# The real tuner (GPU)


def helion_tuner(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    import helion
    import torch

    from mamba2_guard.bench.precision import failing_outputs
    from mamba2_guard.bench.run import graph_timed, precision_of, references
    from mamba2_guard.bench.timing import Timer
    from mamba2_guard.bench.worker import gpu_identity
    from mamba2_guard.core import tuneplan
    from mamba2_kernels import config_store, registry, suites
    from mamba2_kernels.tuning import device_capability, device_slug, pinned_config

    if not torch.cuda.is_available():
        raise RuntimeError("helion_tuner needs a CUDA GPU")
    device = torch.device("cuda")
    job = spec["job"]
    entry = registry.get(job["kernel"])
    shape = suites.load().shape(job["shape"])
    seed, effort, rounds = int(spec["seed"]), spec["effort"], int(spec.get("rounds", 30))
    deadline = time.monotonic() + float(spec["budget_seconds"])
    base_path = spec.get("base_configs")
    base = config_store.load(Path(base_path)) if base_path and Path(base_path).exists() else config_store.ConfigFile()
    # What serves the kernels that base has no config of, on a GPU nobody tuned yet: the incumbent to beat.
    borrowed = config_store.borrowable_files(device_slug(device), device_capability(device))
    # The bring-up's first stage tries every other GPU's configs (other architectures too) instead of searching.
    foreign = ([(other, cf) for other, _, cf in config_store.other_gpu_files(device_slug(device))]
               if spec.get("search") == "borrowed" else None)

    inputs = entry.inputs(shape, seed, device)
    captured, paths_of = captured_on_paths(entry, inputs, spec.get("also_paths") or {})
    launches, tuned_elsewhere, had_config = to_search(captured, spec.get("tuned_elsewhere") or (), base,
                                                      bool(spec.get("missing_only")), own_config_fails)
    timer = Timer(device)
    device_ms = launch_device_ms(timer, launches, captured)
    order = tuneplan.search_order(device_ms)
    launches, device_ms = [launches[i] for i in order], [device_ms[i] for i in order]
    minor = set(tuneplan.minor_launches([(tk.name, str(key)) for tk, _, key in launches], device_ms,
                                        spec.get("tuned_elsewhere") or (),
                                        code=lambda text: config_store.ShapeKey.parse(text).code()))
    left_to_nearby = [[tk.name, str(key)] for i, (tk, _, key) in enumerate(launches) if i in minor]
    kept = [i for i in range(len(launches)) if i not in minor]
    launches, device_ms = [launches[i] for i in kept], [device_ms[i] for i in kept]
    refs = None  # fp64 reference and mamba-ssm's outputs, computed once for every config judged

    def judge(kernel: Any, key: Any, config: dict[str, Any]) -> dict[str, Any]:
        """The public function's precision with ``kernel`` on ``config`` at ``key``."""
        nonlocal refs
        with pinned_config(kernel, config, key), forcing.forced_all(paths_of[kernel.name, str(key)]):
            ours = entry.run_helion(inputs)
        refs = refs or references(entry, inputs, ours)
        verdict = precision_of(entry, inputs, ours, refs)
        return {"ok": verdict.ok, "detail": failing_outputs(verdict.outputs),
                "max_rel_err_vs_fp64": verdict.max_rel_err_vs_fp64,
                "max_abs_diff_vs_mamba_ssm": verdict.max_abs_diff_vs_mamba_ssm, "outputs": list(verdict.outputs)}

    setup_seconds = round(time.monotonic() - started, 3)  # imports (first job), inputs, the recording run
    limit = tuneplan.attempt_limit(spec.get("timeout_seconds"), spec.get("seconds_left"))
    out: list[dict[str, Any]] = []
    deferred: list[list[str]] = []  # the launches left to the next attempt (``tuneplan.defers``)

    def finished(record: dict[str, Any]) -> None:
        out.append(record)
        save_partial(spec, out)

    for i, (tk, kargs, key) in enumerate(launches):
        record: dict[str, Any] = {"kernel": tk.name, "key": str(key), "entry": entry.name, "shape": shape.name,
                                  "device_ms": device_ms[i]}
        incumbent_kind, incumbent, why = incumbent_of(tk, kargs, base, key, borrowed,
                                                      launches=functools.partial(launch_failure, tk, kargs))
        if why is not None:
            record["stored_passed_over"] = why  # the first stored candidate, invalid or not launching here
        default = dict(tk.bound(kargs).config_spec.default_config())
        record.update(incumbent=incumbent_kind, incumbent_config=incumbent or default)
        isolated = (bool(spec.get("helion_benchmark_subprocess")) or tk.name in spec.get("isolate_kernels", [])
                    or [tk.name, str(key)] in spec.get("isolate_launches", []))
        budget = tuneplan.launch_budget(deadline - time.monotonic(), device_ms[i:])
        budget += ISOLATION_START_SECONDS * isolated
        if foreign is None and tuneplan.defers(time.monotonic() - started, budget, limit, i):
            deferred = [[kernel.name, str(key)] for kernel, _, key in launches[i:]]
            break
        save_partial(spec, out, in_flight=[tk.name, str(key)])
        settings = search_settings(effort, seed, budget, isolated)
        record["settings"] = dict(settings)
        seeds = search_seeds(tk, kargs, base, key, incumbent, borrowed)
        if seeds:
            settings["autotune_seed_configs"] = [helion.Config(**seed) for seed in seeds]
        if tk.partial_sums or tk.finish:  # Helion's own check would reject configs that split partials otherwise
            settings["autotune_baseline_accuracy_check_fn"] = tk.autotune_accuracy_check
        if incumbent is not None:
            # After a helion or triton upgrade the committed config may compute wrong results; then any
            # winner that passes replaces it (mamba2_guard.core.tuneplan.decide), however fast.
            t0 = time.monotonic()
            try:
                record["incumbent_precision"] = judge(tk, key, incumbent)
            except Exception as exc:
                _raise_if_cuda_broken()
                record["incumbent_precision"] = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
            record["incumbent_precision_seconds"] = round(time.monotonic() - t0, 1)
        if record.get("incumbent_precision", {}).get("ok") and not settings["autotune_benchmark_subprocess"]:
            # Helion checks candidates against the outputs of its conservative reference config, which
            # at nemotron3-nano ran 50 s for the norm backward before its first candidate (budget 10 s);
            # the incumbent, just shown to pass the precision criterion, gives them in milliseconds.
            settings["autotune_baseline_fn"] = incumbent_run(tk, incumbent)
        record["reference"] = "incumbent" if "autotune_baseline_fn" in settings else "helion"
        record.update(warm_start=incumbent is not None, seed_configs=len(seeds))
        t0 = time.monotonic()
        try:
            tuner = tk.helion_kernel(None, "compiled", **settings)
            if foreign is not None:
                tried = foreign_configs(tk, kargs, key, foreign)
                record["borrowed_from"] = sorted({owner for owner, _ in tried})
                if not tried:
                    finished(record)  # no winner: nothing stored, the search stage takes this launch
                    continue
                best = best_of(tuner.bind(kargs), kargs, [default, *(config for _, config in tried)])
            else:
                best = dict(tuner.autotune(kargs, force=True))
        except Exception as exc:  # one launch failing must not lose the others
            _raise_if_cuda_broken()
            record.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
            finished(record)
            continue
        record.update(config=best, tune_seconds=round(time.monotonic() - t0, 1))
        try:
            t0 = time.monotonic()
            record["precision"] = judge(tk, key, best)
            record["precision_seconds"] = round(time.monotonic() - t0, 1)
            # Timed through the public function, as bench times it: sums of per-program partials, whose
            # size the config decides, are part of the cost. A whole call is timed by its graph replays:
            # timed eagerly, the host work of each call (the pin re-selects the kernel's configs) hid wins
            # of 2-5 % on the H200 (not significant, p 0.06-0.7).
            t0 = time.monotonic()
            paths = paths_of[tk.name, str(key)]
            calls = {"incumbent": _entry_on(entry, inputs, tk, incumbent or default, key, paths),
                     "candidate": _entry_on(entry, inputs, tk, best, key, paths)}
            timed = timer.interleaved_graphs if graph_timed(entry) else timer.interleaved
            samples = timed(calls, rounds=rounds, warmup=3)
            record.update(samples_ms=samples, timing_seconds=round(time.monotonic() - t0, 1))
        except Exception as exc:
            _raise_if_cuda_broken()
            record.update(error=f"validation: {type(exc).__name__}: {exc}",
                          traceback=traceback.format_exc()[-3000:])
        finished(record)
        torch.cuda.empty_cache()
    paths: dict[str, Any] = {}
    if spec.get("also_paths") and not deferred:
        t0 = time.monotonic()
        try:
            paths["paths"] = paths_on_winners(shape.name, seed, rounds, timer, launches, out, list(spec["also_paths"]),
                                              tuneplan.Criteria(**spec.get("criteria") or {}))
        except Exception as exc:  # the launches searched stay: the next job's timing still comes
            _raise_if_cuda_broken()
            paths["paths_error"] = f"{type(exc).__name__}: {exc}"
        paths["paths_seconds"] = round(time.monotonic() - t0, 1)
    return {"launches": out, "tuned_elsewhere": tuned_elsewhere, "had_config": had_config, "deferred": deferred,
            "minor": left_to_nearby, "setup_seconds": setup_seconds, **paths,
            "gpu": gpu_identity(spec.get("device"))}  # which card tuned it: the UUID keeps GPUs apart


def paths_on_winners(shape_name: str, seed: int, rounds: int, timer: Any, launches: list[tuple[Any, tuple, Any]],
                     records: list[dict[str, Any]], stages: list[str], criteria: Any, device: str = "cuda"
                     ) -> list[dict[str, Any]]:
    """The whole call at ``shape_name`` with each fused stage of ``stages`` forced fused and chained
    (``selection_measure.time_paths``' records), each searched launch (``launches`` and their ``records``) on
    the config its decision keeps: what the two paths cost once both are tuned, which the runtime shows only
    after the job's winners reach the config file."""
    from mamba2_guard.core import tuneplan
    from mamba2_guard.flows import selection_measure
    from mamba2_kernels.tuning import pinned_config

    by_slot = {(record["kernel"], record["key"]): record for record in records}
    with contextlib.ExitStack() as pins:
        for kernel, _, key in launches:
            record = by_slot.get((kernel.name, str(key)))
            if record is None or record.get("error") or "samples_ms" not in record:
                continue  # not searched (deferred) or failed: the runtime serves it as it will
            kept = tuneplan.decide(record, criteria).keep
            pins.enter_context(pinned_config(kernel, record["config"] if kept else record["incumbent_config"], key))
        return selection_measure.time_paths(timer, shape_name, seed, device, rounds, stages=stages)


def captured_on_paths(entry: Any, inputs: Any, also_paths: dict[str, str]
                      ) -> tuple[list[tuple[Any, tuple]], dict[tuple[str, str], dict[str, str]]]:
    """The launches (kernel, args) of one call of ``entry`` on the paths its rules pick, then, with ``also_paths``,
    those of a call with those stages forced that the first made no launch of (the other path's kernels); and
    the paths each (kernel name, key) runs on, forced for its search's checks and timings (empty: the rules')."""
    from mamba2_kernels.tuning import capture_launches

    captured: list[tuple[Any, tuple]] = []
    paths_of: dict[tuple[str, str], dict[str, str]] = {}
    for paths in ({}, dict(also_paths)) if also_paths else ({},):
        earlier = set(paths_of)
        with forcing.forced_all(paths), capture_launches() as found:
            entry.run_helion(inputs)
        for kernel, args in found:
            slot = (kernel.name, str(kernel.shape_key(*args)))
            if slot not in earlier:  # all of its repeats: the per-call counts time a launch as often as the call
                paths_of.setdefault(slot, paths)
                captured.append((kernel, args))
    return captured, paths_of


def to_search(captured: Any, elsewhere: Any, base: Any, missing_only: bool,
              fails_here: Callable[[Any, tuple[Any, ...], dict[str, Any]], str | None] | None = None
              ) -> tuple[list[tuple[Any, tuple, Any]], list[list[str]], list[list[str]]]:
    """Which of a job's captured launches (kernel, args) to search, once per (kernel, key): not those an
    earlier job of the run, or a run of the same search identity, searched (``elsewhere``), nor, with
    ``missing_only``, those whose key has its own config in ``base`` (extending coverage, or tuning what
    production hit, need not re-search tuned keys). Returns the launches (kernel, args, key) and the two
    skipped lists of [kernel, key].

    ``fails_here(kernel, args, config)``: why a key's own config does not run here, or None. Such a config is
    drift, not coverage, whoever stored it: the key is searched, against Helion's default (``incumbent_of``).
    An earlier run pinned a nearest config of the state pass under a headdim-80 key on an H100, where it needs
    more shared memory than the GPU has (its search had failed on it as the reference); skipped, that key
    would have run on whatever came next for good."""
    skip = {tuple(slot) for slot in elsewhere}
    launches, seen, tuned_elsewhere, had_config = [], set(), [], []
    for kernel, args in captured:
        key = kernel.shape_key(*args)
        slot = (kernel.name, str(key))
        if slot in seen:
            continue
        seen.add(slot)
        own = base.get(*slot) if missing_only or slot in skip else None
        if own is not None and fails_here is not None and fails_here(kernel, args, own) is not None:
            launches.append((kernel, args, key))
        elif slot in skip:
            tuned_elsewhere.append(list(slot))
        elif own is not None:
            had_config.append(list(slot))
        else:
            launches.append((kernel, args, key))
    return launches, tuned_elsewhere, had_config


def own_config_fails(kernel: Any, args: tuple[Any, ...], config: dict[str, Any]) -> str | None:
    """Why a key's own stored ``config`` does not run at ``args`` here (invalid under this helion, or refused
    at launch), or None."""
    from mamba2_kernels import config_store

    served, why = as_served(kernel, args, config_store.Lookup(dict(config), "exact", None))
    return why if served is None else launch_failure(kernel, args, served)


def launch_failure(kernel: Any, args: tuple[Any, ...], config: dict[str, Any]) -> str | None:
    """Why ``config`` (as the call runs it) does not launch at ``args`` here, or None: Triton's refusal
    (``tuning.launch_error``), or any other error of the launch, since a config that fails otherwise serves no
    better, as an incumbent or as a key's own config."""
    from mamba2_kernels.tuning import launch_error

    try:
        return launch_error(kernel, args, config)
    except Exception as exc:
        _raise_if_cuda_broken()
        return f"{type(exc).__name__}: {exc}"


def launch_device_ms(timer: Any, launches: list[tuple[Any, tuple, Any]], captured: list[tuple[Any, tuple]]
                     ) -> list[float]:
    """Each launch's device time per whole call in ms, on the config the call runs today: the median of 5
    interleaved, L2-flushed runs of the launch, times how often the call launches its key (``captured``).
    What orders the searches and splits the job's budget (``mamba2_guard.core.tuneplan.search_order``,
    ``launch_budget``)."""
    import collections
    import statistics

    if not launches:
        return []
    per_call = collections.Counter((kernel.name, str(kernel.shape_key(*args))) for kernel, args in captured)
    samples = timer.interleaved({str(i): functools.partial(kernel, *args)
                                 for i, (kernel, args, _) in enumerate(launches)}, rounds=5, warmup=1)
    return [statistics.median(samples[str(i)]) * per_call[(kernel.name, str(key))]
            for i, (kernel, _, key) in enumerate(launches)]


def run_on_config(module: str, name: str, config: dict[str, Any], *args: Any) -> Any:
    """The tuned kernel ``module.name`` on ``config``, compiled: Helion's reference run for a search."""
    import importlib

    return getattr(importlib.import_module(module), name).helion_kernel(config, "compiled")(*args)


def search_settings(effort: str, seed: int, budget: int, benchmark_subprocess: bool) -> dict[str, Any]:
    """Helion's settings for one launch's search of ``budget`` seconds.

    Helion benchmarks a population only once all of it compiled, each compile cut at the compile timeout
    (Helion's: 60 s). With a timeout at or above the budget, one slow compile ends the search before any
    candidate ran (NoConfigFound): the norm backward's default config compiles for about 50 s, chunk_cumsum's
    64-head tile at chunk 256 for 15 s. So the timeout is half the budget, at least 5 s: on the H200 the
    compiles of 229 candidates in 9 searches took 1 s at the median and 4.6 s at most, but for that tile.

    The search starts from the config file's evidence (the incumbent and every stored key's config, adapted to
    the call), not from the winners Helion's cache holds on this machine: those make a search depend on which
    jobs ran there before, and helion 1.5.0 puts their flat form into the population without canonicalizing
    it (our seeds it does canonicalize), where one of a key with other loads fails the surrogate's encoding.
    On the H200 an AssertionError there ended five of 23 searches of two zoo-fit whole calls; with this and
    the adapted seeds, none of the next 13."""
    return {"autotune_effort": effort, "autotune_random_seed": seed, "autotune_budget_seconds": budget,
            "autotune_compile_timeout": int(min(60, max(5, budget // 2))),
            "autotune_benchmark_subprocess": benchmark_subprocess, "autotune_best_available_max_configs": 0}


def incumbent_of(kernel: Any, args: tuple[Any, ...], base: Any, key: Any, borrowed: Sequence[Any] = (),
                 launches: Callable[[dict[str, Any]], str | None] | None = None
                 ) -> tuple[str, dict[str, Any] | None, str | None]:
    """What the call runs on today, as the runtime serves it from ``base`` (or, for a kernel ``base`` has no
    config of, from ``borrowed``, another GPU's files: ``config_store.serving_candidates``): (kind, config
    adapted to ``args``, why the first stored candidate does not serve). A config of another key takes this
    call's per-load lists (a flag such as initial states adds loads); judged unadapted it would be invalid, and
    the search would be measured against Helion's default config, which a slow winner beats.

    ``launches(config)``: why an adapted config does not launch here (``tuning.launch_error``), or None. The
    runtime passes over such a candidate to the next; so does the incumbent. Otherwise the search's reference
    would be a config that fails (on the H100, a nearest config's shared memory at a wider headdim lost the
    whole search of that launch), and the winner would be timed against the one the runtime served instead.
    The key's own config failing is drift, not a candidate to pass over: the incumbent is then the default,
    which any winner that passes, or the default itself, replaces (``tuneplan.decide``)."""
    from mamba2_guard.core.tuneplan import COMMITTED, DEFAULT, NEAREST
    from mamba2_kernels import config_store

    first_why = None
    for found in config_store.serving_candidates(base, borrowed, kernel.name, key):
        config, why = as_served(kernel, args, found)
        if config is not None and launches is not None:
            why = launches(config)
        if why is None:
            return (COMMITTED if found.source == "exact" else NEAREST), config, first_why
        first_why = first_why or why
        if found.source == "exact":  # drift: measured against the default, so that a winner or the default replaces it
            break
    return DEFAULT, None, first_why


def as_served(kernel: Any, args: tuple[Any, ...], found: Any) -> tuple[dict[str, Any] | None, str | None]:
    """A stored config (a config-store ``Lookup``) as the runtime would run it for ``args``: adapted to the
    call when it was stored for another key (``complete_config``); or None and why it is invalid here."""
    from mamba2_kernels.tuning import complete_config, validate_config

    other_key = found.source != "exact"
    why = validate_config(kernel, args, found.config, other_key)
    if why is not None:
        return None, why
    return complete_config(kernel, args, found.config, other_key) or dict(found.config), None


def neighbour_seeds(kernel: Any, args: tuple[Any, ...], base: Any, key: Any,
                    borrowed: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The stored configs of the kernel's other shapes (from ``base``, or ``borrowed`` as the runtime would
    serve them) that fit ``args``, nearest first: a neighbour's config can beat the nearest one. On the H200,
    long-context's chunk_scan ran in 1.27 ms on nemotron3-nano's new config and in 1.78 ms on the old one, the
    nearest config it was tuned against."""
    from mamba2_kernels import config_store

    stored = config_store.serving_candidates(base, borrowed, kernel.name, key)
    served = [as_served(kernel, args, found)[0] for found in stored if found.source != "exact"]
    return [config for config in served if config is not None]


def search_seeds(kernel: Any, args: tuple[Any, ...], base: Any, key: Any,
                 incumbent: dict[str, Any] | None, borrowed: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Where a launch's search starts: the incumbent, the incumbent launching its innermost tiles first
    (``mamba2_guard.core.tuneplan.innermost_first``), the neighbours' configs and the kernel's own seeds, each once
    and each valid for ``args``."""
    from mamba2_guard.core import tuneplan
    from mamba2_kernels.tuning import validate_config

    reordered = tuneplan.innermost_first(incumbent) if incumbent is not None else None
    if reordered is not None and validate_config(kernel, args, reordered) is not None:
        reordered = None
    head = [config for config in (incumbent, reordered) if config is not None]
    return _unique(head + neighbour_seeds(kernel, args, base, key, borrowed) + kernel.seed_configs(args))


def foreign_configs(kernel: Any, args: tuple[Any, ...], key: Any, files: Sequence[tuple[str, Any]]
                    ) -> list[tuple[str, dict[str, Any]]]:
    """(owner slug, config) for every config other GPUs' files hold for ``kernel`` that, adapted to ``args``
    (``complete_config``: this call's per-load lists, the default's values for options a file lacks), is a
    valid config here; each config once, the nearest key of each file first."""
    from mamba2_kernels import config_store

    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for owner, cf in files:
        for found in config_store.candidates(cf, kernel.name, key):
            config = as_served(kernel, args, found)[0]
            if config is not None:
                out.setdefault(json.dumps(config, sort_keys=True), (owner, config))
    return list(out.values())


def best_of(bound: Any, args: tuple[Any, ...], configs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of ``configs`` on this GPU by Helion's own finite search (it drops those that fail to
    compile or to match the first config's outputs; the first is Helion's default config)."""
    import helion
    from helion.autotuner import FiniteSearch

    unique = _unique(configs)
    if len(unique) < 2:
        return dict(unique[0])
    return dict(FiniteSearch(bound, args, [helion.Config(**config) for config in unique]).autotune())


def _unique(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list({json.dumps(c, sort_keys=True): c for c in configs}.values())


def incumbent_run(kernel: Any, config: dict[str, Any]) -> Callable[..., Any]:
    """``kernel`` on ``config`` as Helion's ``autotune_baseline_fn``. Helion deep-copies its settings
    (``Settings.to_dict``) and may pickle them for its subprocesses, which a ``helion.Kernel`` (it holds
    locks) does not survive: on the H200 every search given one failed before its first candidate. So a
    module function bound to the kernel's import path and a plain config."""
    import importlib

    module, name = kernel.__module__, kernel.__name__
    if getattr(importlib.import_module(module), name, None) is not kernel:
        raise ValueError(f"kernel: expected a tuned kernel importable as {module}.{name}")
    return functools.partial(run_on_config, module, name, dict(config))


def _raise_if_cuda_broken() -> None:
    """A candidate that faulted (illegal address, launch failure) leaves the CUDA context unusable: end
    the job, and with it this child, so the next job gets a fresh process instead of the same error."""
    import torch

    torch.cuda.synchronize()


def _entry_on(entry: Any, inputs: Any, kernel: Any, config: dict[str, Any], key: Any, paths: dict[str, str]) -> Any:
    from mamba2_kernels.tuning import pinned_config

    run = entry.bind(entry.helion_fn(), inputs)  # what bench times

    def call() -> None:
        with pinned_config(kernel, config, key), forcing.forced_all(paths):
            run()

    return call


if __name__ == "__main__":
    raise SystemExit(main())
