"""One nightly cycle, composed from the pieces: lock, fingerprint, drift, bench, check (with confirming
re-runs), reports, history. The daemon and the CLI both call ``run_cycle``.

On embedded defaults it runs on a laptop: without a GPU it benches the smoke suite in CPU interpret mode
(precision only), with the state directory under the user's state dir.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

from guard import baselines, fingerprint
from guard.bench.run import Progress, bench_case, plain_progress, run_bench
from guard.checking import run_check
from guard.core import drift as drift_mod
from guard.core import report
from guard.core.results import BenchResult, CaseResult
from guard.core.verdicts import Policy, Verdict, exit_code
from guard.history import History
from kernels import config_store, registry, suites
from kernels.config_store import atomic_write_text


class CycleBusy(RuntimeError):
    """Another cycle holds this state directory."""


@dataclass
class CycleOptions:
    suite: str = "default"
    shapes: Sequence[str] = ()
    kernels: Sequence[str] = ()
    seed: int = 0
    rounds: int = 30
    confirm: bool = True
    strict: bool = False  # missing kernels fail the run
    update_baseline: bool = False
    policy: Policy = field(default_factory=Policy)


@dataclass
class CycleOutcome:
    exit_code: int
    result: BenchResult
    verdicts: list[Verdict]
    drift: drift_mod.DriftReport
    paths: dict[str, str]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def selection(options: CycleOptions, progress: Progress) -> tuple[str, list[registry.KernelEntry], list]:
    loaded = suites.load()
    suite = options.suite
    if not torch.cuda.is_available() and not options.shapes and suite != "smoke":
        progress(f"no GPU: the smoke suite in CPU interpret mode replaces suite {suite!r}")
        suite = "smoke"
    shapes = [loaded.shape(s) for s in options.shapes] if options.shapes else loaded.suite(suite)
    return suite, registry.select(list(options.kernels) or None), shapes


def detect_drift(fp: fingerprint.Fingerprint) -> drift_mod.DriftReport:
    slug = fingerprint.gpu_slug(fp)
    configs_path = config_store.path_for(slug)
    configs_fp = config_store.load(configs_path).fingerprint if configs_path.exists() else None
    baseline_doc = baselines.read_document(baselines.path_for(slug))
    baseline_fp = (baseline_doc or {}).get("fingerprint")
    return drift_mod.classify(fp.to_dict(), configs_fp, baseline_fp, dict(config_store.INVALID))


def rerun_on_device(options: CycleOptions) -> Any:
    """The confirmation re-run of one case, in this process (GPU only)."""
    if not torch.cuda.is_available():
        return None
    from guard.bench.nvml import Nvml
    from guard.bench.timing import Timer

    device = torch.device("cuda")
    timer, nvml = Timer(device), Nvml(torch.cuda.current_device())
    loaded = suites.load()

    def rerun(case: CaseResult) -> CaseResult:
        return bench_case(registry.get(case.kernel), loaded.shape(case.shape), seed=options.seed + 1,
                          device=device, rounds=options.rounds, warmup=3, timer=timer, nvml=nvml, peaks={})
    return rerun


def write_reports(state_dir: Path, stamp: str, result: BenchResult, verdicts: list[Verdict],
                  baseline, policy: Policy) -> dict[str, str]:
    reports = state_dir / "reports"
    paths = {"result": reports / f"{stamp}-result.json", "report_json": reports / f"{stamp}-report.json",
             "report_md": reports / f"{stamp}-report.md"}
    atomic_write_text(paths["result"], json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n")
    atomic_write_text(paths["report_json"], json.dumps(report.render_json(result, verdicts, baseline, policy),
                                                       indent=1, allow_nan=False) + "\n")
    markdown = report.render_markdown(result, verdicts, baseline)
    atomic_write_text(paths["report_md"], markdown)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as handle:
            handle.write(markdown + "\n")
    return {k: str(v) for k, v in paths.items()}


def run_cycle(state_dir: Path, options: CycleOptions | None = None, progress: Progress = plain_progress,
              job: str = "nightly") -> CycleOutcome:
    options = options or CycleOptions()
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(state_dir / "nightly.lock"), timeout=0)
    try:
        lock.acquire()
    except Timeout as exc:
        raise CycleBusy(f"another cycle holds {lock.lock_file}") from exc
    try:
        return _cycle(state_dir, options, progress, job)
    finally:
        lock.release()


def _cycle(state_dir: Path, options: CycleOptions, progress: Progress, job: str) -> CycleOutcome:
    started = _now()
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    if not torch.cuda.is_available():
        from kernels.testing import enable_cpu_interpret

        enable_cpu_interpret()
    fp = fingerprint.collect()
    slug = fingerprint.gpu_slug(fp)
    progress(f"fingerprint {fp.digest()[:12]} on {fp.gpu_name or 'CPU'} ({slug}): torch {fp.torch}, "
             f"triton {fp.triton}, helion {fp.helion}, mamba-ssm {fp.mamba_ssm}, driver {fp.driver_version}")
    suite, entries, shapes = selection(options, progress)
    progress(f"suite {suite}: {len(entries)} kernels x {len(shapes)} shapes "
             f"({sum(not e.has_helion for e in entries)} kernels not implemented yet)")
    result = run_bench(entries, shapes, fingerprint=fp.to_dict(), fingerprint_digest=fp.digest(),
                       state_dir=state_dir, suite=suite, seed=options.seed, rounds=options.rounds,
                       progress=progress)
    drift = detect_drift(fp)  # after the bench: it also reports configs the installed helion rejected
    progress(drift.render_text())
    baseline_path = baselines.path_for(slug)
    baseline = baselines.load(baseline_path)
    with History(state_dir / "history.sqlite") as history:
        rerun = rerun_on_device(options) if options.confirm else None
        result, verdicts = run_check(result, baseline, history, options.policy, rerun)
        code = exit_code(verdicts, missing_fails=options.strict)
        history.record(result, verdicts, _now(), job=job, status="pass" if code == 0 else "fail")
    paths = write_reports(state_dir, stamp, result, verdicts, baseline, options.policy)
    if options.update_baseline:
        left_out = baselines.update(baseline_path, result)
        paths["baseline"] = str(baseline_path)
        if left_out:
            progress(f"not written to the baseline: {', '.join(left_out)}")
    if drift.action == "retune":
        progress("drift policy asks for a re-tune: run `python scripts/autotune.py` on this GPU "
                 "(the guard's own autotune command is not available yet)")
    return CycleOutcome(code, result, verdicts, drift, paths)
