"""``mamba2-guard bench``: every kernel x shape, precision and interleaved timing, into a ``BenchResult``.

On a GPU: a per-GPU file lock (two runs never share a device), fresh seeded inputs, precision against
mamba-ssm and the fp64 reference, Helion and mamba-ssm timed interleaved in rounds with L2 flushed
before every call, roofline fractions against measured peaks, NVML clocks and throttle reasons before
and after each case. Without a GPU: the smoke suite in CPU interpret mode, precision only; timings are
marked meaningless.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

from mamba2_guard.bench import peaks as peaks_mod
from mamba2_guard.bench.nvml import Nvml
from mamba2_guard.bench.precision import compare, low_precision
from mamba2_guard.bench.timing import Timer, measured_under
from mamba2_guard.bench.timing import method as timing_method
from mamba2_guard.core.results import BenchResult, CaseResult, Precision, SamplesMs
from mamba2_kernels.registry import COMPOSITE_PHASES, BaselineUnavailable, KernelEntry
from mamba2_kernels.suites import ShapeSpec
from mamba2_kernels.tuning import mamba_ssm

Progress = Callable[[str], None]


def _short_error(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)[-1:]
    where = f" at {frames[0].filename}:{frames[0].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def gpu_lock(state_dir: Path, gpu_key: str, timeout_s: float = 3600) -> FileLock:
    path = state_dir / "locks" / f"gpu-{gpu_key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path), timeout=timeout_s)


@contextlib.contextmanager
def holding_gpu_lock(state_dir: Path, gpu_key: str, progress: Callable[[str], None]) -> Iterator[None]:
    """The GPU's lock held inside the block. Says so when it has to wait, and only then: a log that always
    said "waiting" would hide the one night when another bench or tune did hold the GPU."""
    lock = gpu_lock(state_dir, gpu_key)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress(f"waiting for the GPU lock {lock.lock_file}: another bench or tune holds it")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


@dataclass(frozen=True)
class References:
    """What Helion's outputs are judged against: the fp64 reference, mamba-ssm's outputs (None where it
    does not run) and, only without that peer and for low-precision outputs, the same-dtype reference."""

    fp64: dict[str, torch.Tensor]
    peer: dict[str, torch.Tensor] | None
    same_dtype: dict[str, torch.Tensor] | None


def references(entry: KernelEntry, inputs: dict[str, Any], ours: dict[str, torch.Tensor]) -> References:
    """Computed once per inputs; a tuner judges several configs' outputs against them."""
    fp64 = entry.run_reference(inputs)
    try:
        peer = entry.run_baseline(inputs)
    except BaselineUnavailable:
        peer = None
    same_dtype = entry.run_reference(inputs, dtype=None) if peer is None and low_precision(ours) else None
    return References(fp64, peer, same_dtype)


def precision_of(entry: KernelEntry, inputs: dict[str, Any], ours: dict[str, torch.Tensor],
               refs: References | None = None) -> Precision:
    refs = refs or references(entry, inputs, ours)
    outputs = compare(ours, refs.fp64, refs.peer, entry.tolerance, refs.same_dtype)

    def worst(name: str) -> float | None:
        values = [getattr(o, name) for o in outputs if getattr(o, name) is not None]
        return max(values) if values else None

    return Precision(
        mean_abs_diff_vs_mamba_ssm=worst("mean_abs_diff_vs_mamba_ssm"),
        max_abs_diff_vs_mamba_ssm=worst("max_abs_diff_vs_mamba_ssm"),
        max_rel_err_vs_fp64=worst("max_rel_err_vs_fp64"),
        mamba_ssm_max_rel_err_vs_fp64=worst("mamba_ssm_max_rel_err_vs_fp64"),
        allclose=all(o.allclose for o in outputs),
        finite=all(o.finite for o in outputs),
        ok=all(o.ok for o in outputs),
        outputs=tuple(o.to_dict() for o in outputs),
    )


def graph_timed(entry: KernelEntry, cuda_graphs: bool = False) -> bool:
    """Whether ``entry`` is timed by CUDA-graph replays, by the bench and by the tuner's keep-or-reject
    decision alike: a whole call's eager time is mostly host work (Python, autograd, launches) that swings
    +-15 % between identical runs, and its graph replays are its device work alone."""
    return cuda_graphs or entry.phase.startswith(COMPOSITE_PHASES)


def bench_case(entry: KernelEntry, shape: ShapeSpec, *, seed: int, device: torch.device, rounds: int,
               warmup: int, timer, nvml: Nvml | None, peaks: dict[str, Any], cuda_graphs: bool = False,
               check_precision: bool = True) -> CaseResult:
    """One kernel x shape. ``check_precision=False`` (re-timing only, as the calibration's A/A runs do)
    leaves ``precision`` None, which ``check`` judges an error."""
    base = {"kernel": entry.name, "shape": shape.name, "phase": entry.phase, "seed": seed}
    if not entry.has_helion:
        return CaseResult(**base, missing=True)
    on_gpu = device.type == "cuda"
    try:
        if on_gpu:
            mamba_ssm.forget_last_picks()
        started = time.monotonic()
        inputs = entry.inputs(shape, seed, device)
        precision = precision_of(entry, inputs, entry.run_helion(inputs)) if check_precision else None
        if not on_gpu:
            return CaseResult(**base, precision=precision, timings_meaningful=False)
        precision_s = time.monotonic() - started
        before = nvml.state() if nvml else None
        fns = {"helion": entry.bind(entry.helion_fn(), inputs)}
        with contextlib.suppress(BaselineUnavailable):  # no peer: Helion is timed alone
            fns["mamba_ssm"] = entry.bind(entry.baseline_fn(), inputs)
        graphs = graph_timed(entry, cuda_graphs)
        samples = (timer.interleaved_graphs if graphs else timer.interleaved)(fns, rounds=rounds, warmup=warmup)
        after = nvml.state() if nvml else None
        median = sorted(samples["helion"])[len(samples["helion"]) // 2]
        throttled = bool((before and before.throttled) or (after and after.throttled))
        return CaseResult(
            **base, precision=precision,
            samples_ms=SamplesMs(tuple(samples["helion"]), tuple(samples.get("mamba_ssm", ()))),
            roofline_fraction=peaks_mod.roofline_fraction(entry.bytes_moved(shape), entry.flops(shape), median, peaks),
            throttled=throttled,
            extra={"clocks_before": before.to_dict() if before else None,
                   "clocks_after": after.to_dict() if after else None,
                   "timing_method": timing_method(graphs),
                   # first calls (compile, mamba-ssm's autotune) and precision, then the timed rounds
                   "seconds": {"precision": round(precision_s, 2),
                               "timing": round(time.monotonic() - started - precision_s, 2)},
                   "mamba_ssm_autotune": mamba_ssm.last_picks()},
        )
    except Exception as exc:  # one failing kernel must not stop the suite
        return CaseResult(**base, error=_short_error(exc))
    finally:
        if on_gpu:
            torch.cuda.empty_cache()


def with_layer_shares(cases: Sequence[CaseResult]) -> list[CaseResult]:
    """Each kernel's share of its shape's layer time, by mamba-ssm's medians (the fixed reference).
    Whole calls (``COMPOSITE_PHASES``) contain the kernels, so they neither count nor get a share."""
    import dataclasses

    counted = [c for c in cases if c.mamba_ssm_median_ms is not None and not c.phase.startswith(COMPOSITE_PHASES)]
    totals: dict[str, float] = {}
    for case in counted:
        totals[case.shape] = totals.get(case.shape, 0.0) + case.mamba_ssm_median_ms
    return [dataclasses.replace(case, layer_share=case.mamba_ssm_median_ms / totals[case.shape])
            if case in counted and totals[case.shape] else case for case in cases]


def resumed_plan(done: Sequence[CaseResult], planned: Sequence[tuple[str, str]], progress: Progress
                 ) -> tuple[list[CaseResult], list[tuple[str, str]]]:
    """A resumed run's cases measured before (``done``), not measured again, and its plan of (shape, kernel):
    ``planned``, behind the cases of ``done`` outside it, which stay in the result as they were."""
    keys = set(planned)
    outside = [(case.shape, case.kernel) for case in done if (case.shape, case.kernel) not in keys]
    plan = [*outside, *planned]
    if done:
        progress(f"resumed: {len(done)} of {len(plan)} case(s) measured before, {len(plan) - len(done)} to go"
                 + (f" ({len(outside)} outside this selection, kept as they were)" if outside else ""))
    return list(done), plan


def result_so_far(cases: Sequence[CaseResult], planned: Sequence[tuple[str, str]], *, fingerprint: dict[str, Any],
                  device_peaks: dict[str, Any], suite: str | None, started_at: str, extra: dict[str, Any]
                  ) -> BenchResult:
    """A run's ``cases`` in the order of its plan of (shape, kernel), with layer shares over them all; marked
    ``extra["partial"]`` (cases measured of those planned) while some are missing, which ``--resume``
    continues and ``check`` points out."""
    order = {key: i for i, key in enumerate(planned)}
    if len(cases) < len(planned):
        extra = {**extra, "partial": {"cases": len(cases), "planned": len(planned)}}
    ordered = sorted(cases, key=lambda c: order[(c.shape, c.kernel)])
    return BenchResult(fingerprint=measured_under(fingerprint), cases=tuple(with_layer_shares(ordered)),
                       device_peaks=device_peaks, suite=suite, started_at=started_at, extra=extra)


def plain_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_bench(entries: Sequence[KernelEntry], shapes: Sequence[ShapeSpec], *, fingerprint: dict[str, Any],
              fingerprint_digest: str, state_dir: Path, suite: str | None, seed: int = 0, rounds: int = 30,
              warmup: int = 3, progress: Progress = plain_progress, cuda_graphs: bool = False,
              check_precision: bool = True, done: Sequence[CaseResult] = (), started_at: str | None = None,
              checkpoint: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """Every entry x shape, shape-major. ``done``: cases measured before (a resumed run, which keeps its
    ``started_at``), not measured again; those outside this plan stay in the result ahead of it.
    ``checkpoint`` gets the result so far after each case, marked ``extra["partial"]`` until the last, so that
    a run killed midway keeps what it measured."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = started_at or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    plan = [(shape, entry) for shape in shapes for entry in entries]
    cases, planned = resumed_plan(done, [(shape.name, entry.name) for shape, entry in plan], progress)
    measured = {(case.shape, case.kernel) for case in cases}
    todo = [(shape, entry) for shape, entry in plan if (shape.name, entry.name) not in measured]
    total = len(todo)
    peaks: dict[str, Any] = {}

    def result() -> BenchResult:
        return result_so_far(cases, planned, fingerprint=fingerprint, device_peaks=peaks, suite=suite,
                             started_at=started, extra={"seed": seed, "rounds": rounds, "device": str(device),
                                                        "cuda_graphs": cuda_graphs})

    def record(i: int, case: CaseResult, seconds: float) -> None:
        progress(_line(i, total, case, seconds))
        cases.append(case)
        if checkpoint is not None:
            checkpoint(result())

    if device.type == "cuda":
        index = torch.cuda.current_device()
        with holding_gpu_lock(state_dir, fingerprint.get("gpu_uuid") or str(index), progress):
            peaks.update(peaks_mod.cached(state_dir, fingerprint_digest))
            timer, nvml = Timer(device), Nvml(index, uuid=fingerprint.get("gpu_uuid"))
            for i, (shape, entry) in enumerate(_with_bar(todo, total)):
                t0 = time.monotonic()
                case = bench_case(entry, shape, seed=seed, device=device, rounds=rounds, warmup=warmup,
                                  timer=timer, nvml=nvml, peaks=peaks, cuda_graphs=cuda_graphs,
                                  check_precision=check_precision)
                record(i, case, time.monotonic() - t0)
    else:
        progress("no GPU: CPU interpret mode; precision is checked, timings mean nothing")
        for i, (shape, entry) in enumerate(_with_bar(todo, total)):
            t0 = time.monotonic()
            case = bench_case(entry, shape, seed=seed, device=device, rounds=1, warmup=0, timer=None, nvml=None,
                              peaks=peaks)
            record(i, case, time.monotonic() - t0)
    return result()


def _with_bar(cases: Iterable[tuple[ShapeSpec, KernelEntry]], total: int) -> Iterable[tuple[ShapeSpec, KernelEntry]]:
    """A rich progress bar on a terminal; CI logs get the plain per-case lines alone."""
    if not sys.stderr.isatty():
        return cases
    from rich.console import Console
    from rich.progress import track

    return track(cases, total=total, description="bench", console=Console(stderr=True), transient=True)


def _line(i: int, total: int, case: CaseResult, seconds: float) -> str:
    if case.missing:
        what = "missing-kernel"
    elif case.error:
        what = f"error: {case.error}"
    elif case.timings_meaningful and case.helion_median_ms is not None:
        what = f"helion {case.helion_median_ms:.4f} ms" + (
            f", mamba-ssm {case.mamba_ssm_median_ms:.4f} ms, {case.speedup:.2f}x" if case.speedup is not None
            else " (no mamba-ssm here)")
    elif case.precision is None:
        what = "no precision data"
    else:
        what = (f"precision {'ok' if case.precision.ok else 'FAIL'} "
                f"(max rel err vs fp64 {case.precision.max_rel_err_vs_fp64:.1e})")
    if case.throttled:
        what += "; throttled, so no baseline row (--resume measures it again)"
    return f"[{i + 1}/{total}] {case.shape} {case.kernel}: {what} ({seconds:.1f}s)"
