"""The config-selection rule's evidence: measure how stored configs transfer across a grid of shapes, fit the
rule (``mamba2_guard.core.selection_fit``) and write both into the config file; and warm the compile cache for shapes.

``measure`` runs each grid shape's whole SSD call once to capture every kernel launch with its real
arguments, then times, for each launch's shape key, every config stored for that kernel at any key (adapted
to the call, as the runtime adapts it). Compiles dominate: they run first in parallel child processes, each
launching the configs once on arguments of the launch's layout so that Triton's on-disk cache holds them,
and the timing process then only loads them (on a CPU, where nothing compiles, there is no pool).

It then times the whole call at the shape with each fused stage (``mamba2_kernels.ssd.forcing.STAGES``) forced
fused and forced chained (``mamba2_kernels.ssd.fused_paths``), by CUDA-graph replays: the evidence of the
stages' chain and fuse rules.

``fit_into`` turns a measurement file into the config file's entries: the best config at each grid key, each
kernel's fitted weights and each fused stage's rule. All are reviewed in the config PR like tuned configs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mamba2_guard.core import selection_fit as fitting
from mamba2_kernels import config_store, files
from mamba2_kernels.ssd import forcing

WHOLE_CALL = "ssd_combined_fwd_bwd"


@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    previous = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def captured_launches(shape_name: str, seed: int, device: str, entry_name: str = WHOLE_CALL) -> list[tuple[Any, tuple]]:
    """The (kernel, args) of each distinct shape key the whole call launches at ``shape_name``, in launch order.
    On a GPU the call runs as a job runs it, compiling the configs the runtime selects (candidates the measure
    compiles anyway): Helion's reference mode would run every tile of a full-size grid shape in Python, which
    takes longer than those compiles. On a CPU the reference mode is the faster."""
    from mamba2_kernels import registry, suites
    from mamba2_kernels.tuning import capture_launches

    entry = registry.get(entry_name)
    inputs = entry.inputs(suites.load().shape(shape_name), seed, device)
    mode = _env("HELION_INTERPRET", "1") if device == "cpu" else contextlib.nullcontext()
    with mode, capture_launches() as launches:
        entry.run_helion(inputs)
    seen, distinct = set(), []
    for kernel, args in launches:
        key = (kernel.name, str(kernel.shape_key(*args)))
        if key not in seen:
            seen.add(key)
            distinct.append((kernel, args))
    return distinct


def candidate_configs(kernel: Any, args: tuple, cf: config_store.ConfigFile
                      ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Stored key -> its config adapted to ``args``, for every stored config of the kernel that generates code
    for ``args``; configs that adapt to the same thing are timed once, under their first key. Also each other
    stored key whose config adapted to a timed one -> that one's key: the fit must know that choosing it
    chooses the timed config."""
    from mamba2_kernels.tuning import adapt_config, config_error

    out: dict[str, dict[str, Any]] = {}
    aliases: dict[str, str] = {}
    stored = cf.kernels.get(kernel.name, {})
    if not stored:  # nothing to time, so no binding (Helion's front end: seconds per kernel and shape)
        return out, aliases
    bound = kernel.bound(args)
    for text, config in sorted(stored.items()):
        adapted = adapt_config(bound, config, other_key=True)
        same = next((timed for timed, candidate in out.items() if candidate == adapted), None)
        if same is not None:
            aliases[text] = same
        elif config_error(bound, adapted) is None:
            out[text] = adapted
    return out, aliases


@dataclass(frozen=True)
class TensorLayout:
    """A launch argument's tensor as a compile needs it: its layout within its storage, its dtype, and the
    storage's values where they are integers (seq_idx, chunk indices: they address memory). Floating values
    only feed arithmetic, so a child process compiles on zeros and need not run the whole call to get them."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    storage: int  # elements
    dtype: Any
    values: Any  # the storage's integer values on the CPU, or None

    @classmethod
    def of(cls, tensor: Any) -> TensorLayout:
        storage = tensor.untyped_storage().nbytes() // tensor.element_size()
        integers = not (tensor.dtype.is_floating_point or tensor.dtype.is_complex)
        return cls(tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(), storage, tensor.dtype,
                   tensor.as_strided((storage,), (1,), 0).cpu() if integers else None)

    def build(self, device: str) -> Any:
        import torch

        base = torch.zeros(self.storage, dtype=self.dtype, device=device)
        if self.values is not None:
            base.copy_(self.values)
        return base.as_strided(self.shape, self.stride, self.offset)


def launch_layout(args: tuple) -> tuple:
    """``args`` with each tensor replaced by its ``TensorLayout``: what a compile worker needs, small to send."""
    import torch

    return tuple(TensorLayout.of(a) if isinstance(a, torch.Tensor) else a for a in args)


def _compile_worker(kernel_name: str, layout: tuple, config_path: str, device: str) -> int:
    """Child process: launch every candidate of one kernel launch (``layout``, from ``launch_layout``) once
    (Triton compiles on first launch and keeps the result in its on-disk cache). Returns how many ran."""
    from mamba2_kernels.tuning import tuned_kernels

    device = _in_child(device)
    kernel = tuned_kernels()[kernel_name]
    args = tuple(a.build(device) if isinstance(a, TensorLayout) else a for a in layout)
    cf = config_store.load(Path(config_path))
    done = 0
    for config in candidate_configs(kernel, args, cf)[0].values():
        with contextlib.suppress(Exception):  # a failing candidate is reported by the timing process
            kernel.compiled(args, config)(*args)
            done += 1
    _synchronize(device)
    return done


def _in_child(device: str) -> str:
    """``device`` for a spawned child process, which on a CPU needs interpret mode set up again."""
    if device == "cpu":
        from mamba2_kernels.testing import enable_cpu_interpret

        enable_cpu_interpret()
    return device


def _synchronize(device: str) -> None:
    import torch

    if device != "cpu":
        torch.cuda.synchronize()


SIDES = ("helion", "mamba_ssm")

# Where Triton, Helion and Inductor keep what they compiled (Helion's Triton cache defaults to a directory
# under Inductor's): all empty on a machine that never ran anything.
COMPILE_CACHE_VARIABLES = ("TRITON_CACHE_DIR", "HELION_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


@contextlib.contextmanager
def empty_compile_caches() -> Iterator[Path]:
    """Point this process's compile caches at new, empty directories under one root, removed afterwards with
    the variables restored. Each library reads its variable when it looks a cache up, not at import."""
    with tempfile.TemporaryDirectory(prefix="mamba2-guard-caches-") as root, contextlib.ExitStack() as variables:
        for name in COMPILE_CACHE_VARIABLES:
            variables.enter_context(_env(name, os.path.join(root, name.lower())))
        yield Path(root)


def _first_calls(shape_name: str, seed: int, entries: Sequence[str], sides: Sequence[str],
                 empty_caches: bool = False) -> float:
    """Child process: run each entry once at ``shape_name``, ours on the configs the runtime selects (compiling
    them, or loading them from the on-disk caches; with ``empty_caches`` always compiling, into new caches)
    and, with "mamba_ssm" in ``sides``, mamba-ssm's (its first call autotunes). Returns the seconds of those
    calls: the inputs and the process's CUDA start are not counted, since a training job pays them either
    way."""
    with empty_compile_caches() if empty_caches else contextlib.nullcontext():
        import torch

        from mamba2_kernels import registry, suites

        device = _in_child("cuda" if torch.cuda.is_available() else "cpu")
        shape = suites.load().shape(shape_name)
        runs = []
        for name in entries:
            entry = registry.get(name)
            inputs = entry.inputs(shape, seed, device)
            runs += [functools.partial(entry.run_helion if side == "helion" else entry.run_baseline, inputs)
                     for side in sides]
        _synchronize(device)
        started = time.monotonic()
        for run in runs:
            run()
        _synchronize(device)
        return time.monotonic() - started


def in_parallel(worker: Any, jobs: Sequence[tuple], processes: int, fresh: bool = False) -> list[Any]:
    """``worker(*job)`` for each job in spawned child processes (each its own CUDA context); with ``fresh``
    each job in a new process."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=processes, mp_context=context,
                                                max_tasks_per_child=1 if fresh else None) as pool:
        futures = [pool.submit(worker, *job) for job in jobs]
        return [f.result() if f.exception() is None else repr(f.exception()) for f in futures]


def measure(shapes: Sequence[str], *, config: Path, seed: int, rounds: int, processes: int, out: Path,
            device: str = "cuda", timer: Any = None, paths_only: bool = False) -> list[dict]:
    """Time every config stored in ``config`` for each kernel at each grid shape's keys (not with
    ``paths_only``), then the whole call with each state pass forced fused and chained; append the records to
    ``out`` (JSON lines: a shape's launch keys when first captured, one per kernel x key and one per shape x
    state pass, as each finishes). Shape by shape, so that a run cut short keeps what it measured, and a rerun
    with the same ``out`` measures only what is missing: a shape's candidates compile in the pool's processes,
    then are timed here (``timer``: ``mamba2_guard.bench.timing.Timer`` on ``device`` unless given). Returns the
    records this run added."""
    if timer is None:
        from mamba2_guard.bench.timing import Timer

        timer = Timer(device)
    started = time.monotonic()
    cf = config_store.load(config)
    earlier = read_records(out) if out.exists() else []
    done = {(r["shape"], r["kernel"], r["key"]) for r in earlier if "kernel" in r}
    paths_done = {(r["shape"], r["stage"]) for r in earlier if "stage" in r}
    known_launches = {r["shape"]: r["launches"] for r in earlier if "launches" in r}
    records = []
    # On a CPU nothing is compiled (Triton's interpreter runs the code), so there is no cache for a pool to warm.
    compiling = (concurrent.futures.ProcessPoolExecutor(max_workers=processes,
                                                        mp_context=multiprocessing.get_context("spawn"))
                 if device != "cpu" else contextlib.nullcontext())
    with compiling as pool:
        for shape_name in shapes:
            launches, launch_record = ([], None) if paths_only else _launches_to_measure(
                shape_name, seed, device, known_launches.get(shape_name), done)
            if launch_record is not None:
                records.append(launch_record)
                _append(out, [launch_record])
            if launches and pool is not None:
                jobs = [pool.submit(_compile_worker, kernel.name, launch_layout(args), str(config), device)
                        for kernel, args in launches]
                concurrent.futures.wait(jobs)
                print(f"{shape_name}: compiled in {time.monotonic() - started:.0f} s", flush=True)
            for kernel, args in launches:
                record = _time_candidates(timer, shape_name, kernel, args, cf, rounds)
                records.append(record)
                _append(out, [record])
                print(f"{shape_name} {kernel.name}: {len(record['ms'])} configs ({time.monotonic() - started:.0f} s)",
                      flush=True)
            path_records = time_paths(timer, shape_name, seed, device, rounds, done=paths_done)
            records += path_records
            _append(out, path_records)
            if not launches and not path_records:
                print(f"{shape_name}: measured by an earlier run", flush=True)
            del launches
            if device != "cpu":
                import torch

                torch.cuda.empty_cache()
    return records


def _launches_to_measure(shape_name: str, seed: int, device: str, known: list | None, done: set
                         ) -> tuple[list[tuple[Any, tuple]], dict | None]:
    """The (kernel, args) of ``shape_name``'s launches not measured yet, and, at the shape's first capture, the
    record of its launch keys. A shape whose recorded launch keys (``known``) are all in ``done`` is not captured
    again: on a GPU the capture compiles the whole call."""
    if known is not None and all((shape_name, name, key) in done for name, key in known):
        return [], None
    captured = captured_launches(shape_name, seed, device)
    keys = [[kernel.name, str(kernel.shape_key(*args))] for kernel, args in captured]
    missing = [(kernel, args) for (kernel, args), (name, key) in zip(captured, keys, strict=True)
               if (shape_name, name, key) not in done]
    return missing, None if known is not None else {"shape": shape_name, "launches": keys}


def _append(out: Path, records: list[dict]) -> None:
    """Add the records to ``out``, rewritten atomically: a run killed while writing leaves the records before
    whole, not a torn last line that stops the rerun (``read_records``)."""
    earlier = files.read_regular(out).decode() if out.exists() else ""
    files.atomic_write(out, earlier + "".join(json.dumps(record, sort_keys=True) + "\n" for record in records))


def time_paths(timer: Any, shape_name: str, seed: int, device: str, rounds: int,
               stages: Sequence[str] = forcing.STAGES, done: set | frozenset = frozenset()) -> list[dict]:
    """The whole call at ``shape_name`` with each fused stage of ``stages`` (the state passes, the forward's
    outputs) forced fused and chained, timed as CUDA-graph replays (interleaved): one record per stage not in
    ``done``, (shape, stage) pairs."""
    from mamba2_kernels import registry, suites
    from mamba2_kernels.ssd import fused_paths

    stages = [stage for stage in stages if (shape_name, stage) not in done]
    if not stages:
        return []
    shape = suites.load().shape(shape_name)
    entry = registry.get(WHOLE_CALL)
    call = entry.bind(entry.helion_fn(), entry.inputs(shape, seed, device))

    def forced(stage: str, path: str) -> Any:
        def run() -> Any:
            with fused_paths.forced(stage, path):
                return call()
        return run

    records = []
    for stage in stages:
        samples = timer.interleaved_graphs({path: forced(stage, path) for path in fused_paths.PATHS}, rounds=rounds)
        records.append({"shape": shape_name, "stage": stage, "chunk_size": shape.chunk_size,
                        "state": fused_paths.state_elements(shape.batch, shape.nheads, shape.headdim, shape.dstate),
                        "heads_per_group": shape.nheads // shape.ngroups,
                        "ms": {path: sorted(s)[len(s) // 2] for path, s in samples.items()}})
        print(f"{shape_name} {stage}: " + ", ".join(f"{p} {ms:.4f} ms" for p, ms in records[-1]["ms"].items()),
              flush=True)
    return records


def _time_candidates(timer: Any, shape_name: str, kernel: Any, args: tuple, cf: config_store.ConfigFile,
                     rounds: int) -> dict:
    """One kernel launch's candidates, timed interleaved: its measurement record."""
    candidates, aliases = candidate_configs(kernel, args, cf)
    fns, errors = {}, {}
    for source, config in candidates.items():
        try:
            fn = kernel.compiled(args, config)
            fn(*args)
        except Exception as exc:  # noqa: BLE001 (recorded; the other candidates still run)
            errors[source] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        fns[source] = functools.partial(fn, *args)
    samples = timer.interleaved(fns, rounds=rounds) if fns else {}
    return {"shape": shape_name, "kernel": kernel.name, "key": str(kernel.shape_key(*args)),
            "ms": {source: sorted(s)[len(s) // 2] for source, s in samples.items()}, "errors": errors,
            "configs": {source: candidates[source] for source in samples}, "aliases": aliases}


# The fields each kind of measurement record needs: a kernel's configs at one key, a shape's launch keys, or a
# state pass both ways.
# A kernel record without aliases (written before they were recorded) would bias the fit: every stored key whose
# config was timed under another key's name would look unmeasured there.
RECORD_FIELDS = {"kernel": ("shape", "kernel", "key", "ms", "configs", "aliases"),
                 "launches": ("shape", "launches"),  # a shape's launch keys: a rerun need not capture it again
                 "stage": ("shape", "stage", "chunk_size", "state", "ms")}


def read_records(path: Path) -> list[dict]:
    """The records of a measurements file, each checked for its fields; a file that is not a regular file of a
    measurement file's size (a FIFO, a link to /dev/zero) or a line that is no record is a ValueError naming it."""
    try:
        lines = files.read_regular(path).decode().splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the measurements: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not JSON lines of measurement records: {exc}") from exc
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise ValueError(f"{path}: line {number}: not a JSON measurement record") from None
        kind = next((kind for kind in ("kernel", "launches") if isinstance(record, dict) and kind in record), "stage")
        missing = [name for name in RECORD_FIELDS[kind] if not isinstance(record, dict) or name not in record]
        if missing:
            raise ValueError(f"{path}: line {number}: expected a {kind} record with {', '.join(RECORD_FIELDS[kind])}; "
                             f"it lacks {', '.join(missing)}")
        records.append(record)
    return records


def key_distance(a: str, b: str, weights: Any) -> float:
    """The config store's nearest-key distance between two key texts (``mamba2_guard.core.selection_fit.Distance``)."""
    return config_store.ShapeKey.parse(a).distance(config_store.ShapeKey.parse(b), config_store.Weights(**weights))


def fit_into(path: Path, measurements: Path) -> list[fitting.Fit]:
    """Fit the rule to a measurement file and write it, with the grid winners, into the config file ``path``
    (atomically). Raises ValueError naming the file that cannot be used."""
    return fit_records_into(path, read_records(measurements), measurements)


def fit_records_into(path: Path, records: list[dict], source: Path | str) -> list[fitting.Fit]:
    """``fit_into`` of measurement ``records`` read from ``source`` (a file, or what else holds them)."""
    if not path.is_file():
        # On a machine without a GPU the default slug names no committed file: say which one to give.
        raise ValueError(f"{path}: no such config file; the fit goes into the config file of the GPU that "
                         "measured it: pass --gpu-slug (e.g. nvidia-h200) or --out")
    if not records:
        raise ValueError(f"{source}: no measurement records (expected `mamba2-guard dev measure-selection`'s "
                         "JSON lines)")
    try:
        with config_store.writing(path):
            new, fits = apply_fit(config_store.load(path), records)
            config_store.save(path, new)
    except config_store.ConfigFileError as exc:
        raise ValueError(str(exc)) from exc
    return fits


def warm(shapes: Sequence[str], entries: Sequence[str], processes: int, baseline: bool) -> dict[str, Any]:
    """Compile the configs the runtime selects for ``entries`` at ``shapes`` (and mamba-ssm's with ``baseline``)
    in parallel processes, into Triton's on-disk cache: a job's first call then only loads them. Returns
    each shape's seconds (or the error's text)."""
    sides = SIDES if baseline else SIDES[:1]
    jobs = [(name, 0, tuple(entries), sides) for name in shapes]
    return dict(zip(shapes, in_parallel(_first_calls, jobs, processes), strict=True))


def first_call_seconds(shapes: Sequence[str], entries: Sequence[str], sides: Sequence[str] = SIDES,
                       empty_caches: bool = False,
                       on_shape: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, dict[str, Any]]:
    """The cold start of a training job at each of ``shapes``: per side, the seconds of the first call of
    ``entries`` in a fresh process, one process at a time (compiles would compete for the CPU otherwise).
    The on-disk caches (``dev warm``'s precompiles among them) are the caller's, or with ``empty_caches``
    new and empty for each process, as on a machine that never ran the shape. ``on_shape(shape, by_side)``
    runs as each shape finishes, so that a run cut short (a device call's time limit) keeps the shapes
    before. Returns {shape: {side: seconds, or the error's text}}."""
    seconds: dict[str, dict[str, Any]] = {}
    for name in shapes:
        jobs = [(name, 0, tuple(entries), (side,), empty_caches) for side in sides]
        seconds[name] = dict(zip(sides, in_parallel(_first_calls, jobs, 1, fresh=True), strict=True))
        if on_shape is not None:
            on_shape(name, seconds[name])
    return seconds


def apply_fit(cf: config_store.ConfigFile, records: list[dict]) -> tuple[config_store.ConfigFile, list[fitting.Fit]]:
    """``cf`` with, per kernel measured: the best config at each grid key (unless a tuned one is stored there)
    and the fitted weights; per state pass measured: its chain rule (none: the fused kernel everywhere); for
    each fusion of ``forcing.FUSE_STAGES`` measured: its fuse rule (none: the chain everywhere). Returns the new
    file and the fits."""
    kernels = dict((name, dict(by_key)) for name, by_key in cf.kernels.items())
    selection = {name: dict(rule) for name, rule in cf.selection.items()}
    fits: list[fitting.Fit | fitting.ChainFit | fitting.FuseFit] = []
    kernel_records = [r for r in records if "kernel" in r]
    for kernel in sorted({r["kernel"] for r in kernel_records}):
        rows = [fitting.Measured(kernel, r["key"], r["ms"], r["aliases"])
                for r in kernel_records if r["kernel"] == kernel and r["ms"]]
        if not rows:
            continue
        stored = sorted(cf.kernels.get(kernel, {}))
        result = fitting.fit(rows, key_distance, stored)
        fits.append(result)
        selection.setdefault(kernel, {}).update(result.selection_entry())
        configs = {r["key"]: r["configs"] for r in kernel_records if r["kernel"] == kernel}
        for key, source in result.best.items():
            kernels.setdefault(kernel, {}).setdefault(key, configs[key][source])
    path_records = [r for r in records if "stage" in r]
    for stage in sorted({r["stage"] for r in path_records}):
        rows = [fitting.PathMeasured(stage, r["chunk_size"], r["state"], r["ms"]["fused"], r["ms"]["chain"],
                                     r.get("heads_per_group", 0)) for r in path_records if r["stage"] == stage]
        kind, path_fit = ("fuse", fitting.fit_fuse(rows)) if stage in forcing.FUSE_STAGES else (
            "chain", fitting.fit_chain(rows))
        fits.append(path_fit)
        rule = selection.setdefault(stage, {})
        rule.pop(kind, None)
        if path_fit.rule is not None:
            rule[kind] = path_fit.selection_entry()
        if not rule:
            del selection[stage]
    return config_store.ConfigFile(cf.fingerprint, cf.tuned, kernels, selection), fits
