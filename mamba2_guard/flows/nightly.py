"""One nightly cycle, composed from the pieces: lock, fingerprint, drift, bench, check (with confirming
re-runs), reports, history. The daemon and the CLI both call ``run_cycle``.

On embedded defaults it runs on a laptop: without a GPU it benches the smoke suite in CPU interpret mode
(precision only), with the state directory under the user's state dir.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mamba2_guard import EXIT_BUSY
from mamba2_guard import config as guard_config
from mamba2_guard.adapters import fingerprint
from mamba2_guard.adapters.files import check_writable, clean_stale_temp_files
from mamba2_guard.adapters.history import History
from mamba2_guard.adapters.state import exclusive
from mamba2_guard.bench.run import Progress, bench_case, plain_progress
from mamba2_guard.core import drift as drift_mod
from mamba2_guard.core import report
from mamba2_guard.core.results import BenchResult, CaseResult
from mamba2_guard.core.verdicts import Policy, Verdict, exit_code
from mamba2_guard.flows import baselines
from mamba2_guard.flows.check import earlier_speedups, history_windows, run_check
from mamba2_kernels import config_store, registry, suites
from mamba2_kernels.files import atomic_write

log = logging.getLogger(__name__)


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
    out_dir: str | None = None  # also copy the reports here (CI artifacts)
    force_retune: bool = False  # re-tune even without drift (the daemon's drift watch, workflow_dispatch)
    cuda_graphs: bool = False  # time CUDA-graph replays (mamba2_guard.bench.timing.Timer.interleaved_graphs)
    config: str | None = None  # guard config file (default: <state>/guard.yaml if present, else defaults)
    root: str | None = None  # checkout holding mamba2_kernels/configs and baselines (default: this one)
    pr: bool = True  # run the PR step when drift or a re-tune calls for it (also guard config pr.enabled)
    policy: Policy = field(default_factory=Policy)
    workers: int | str = 1  # bench workers, one per GPU: a number or "auto" (mamba2_guard.bench.shard)
    bench_fn: str | None = None  # module:function of the sharded bench's worker (tests: a fake one)
    case_timeout_s: float = 1800.0  # a sharded worker with no finished case for this long is killed


@dataclass
class CycleOutcome:
    exit_code: int
    result: BenchResult
    verdicts: list[Verdict]
    drift: drift_mod.DriftReport
    paths: dict[str, str]
    steps: dict[str, Any] = field(default_factory=dict)  # retune / pr: what the follow-up steps did


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


# The zoo's whole calls, benched by every GPU nightly of the default suite: the shapes users run, tuned or not.
ZOO_SUITES = ("zoo-steered", "zoo-fit")
ZOO_ENTRIES = ("ssd_combined_fwd", "ssd_combined_fwd_bwd")


def zoo_selection(options: CycleOptions, on_gpu: bool) -> tuple[list[registry.KernelEntry], list]:
    """The zoo's whole calls x shapes a nightly benches besides its suite: on a GPU, for the default suite
    chosen by name (not for explicit shapes or kernels); none otherwise."""
    if not on_gpu or options.suite != "default" or options.shapes or options.kernels:
        return [], []
    loaded = suites.load()
    return registry.select(list(ZOO_ENTRIES)), [shape for name in ZOO_SUITES for shape in loaded.suite(name)]


def selection(options: CycleOptions, progress: Progress) -> tuple[str, list[registry.KernelEntry], list]:
    loaded = suites.load()
    suite = options.suite
    loaded.suite(suite)  # an unknown name is a usage error here too, not silently the smoke suite
    if not torch.cuda.is_available() and not options.shapes and suite != "smoke":
        progress(f"no GPU: the smoke suite in CPU interpret mode replaces suite {suite!r}")
        suite = "smoke"
    shapes = [loaded.shape(s) for s in options.shapes] if options.shapes else loaded.suite(suite)
    return suite, registry.select(list(options.kernels) or None), shapes


def recorded_paths(gpu_slug: str, root: Path | str | None = None) -> tuple[Path, Path]:
    """``mamba2_kernels/configs/<slug>.yaml`` and ``baselines/<slug>.yaml`` of a checkout (default: this one)."""
    if root is None:
        return config_store.path_for(gpu_slug), baselines.path_for(gpu_slug)
    root = Path(root)
    configs = config_store.path_for(gpu_slug, root / "mamba2_kernels" / "configs")
    return configs, baselines.path_for(gpu_slug, root / "baselines")


def invalid_configs(gpu_slug: str) -> dict[tuple[str, str], str]:
    """Stored configs of this GPU that the installed helion rejected while kernels ran in this process."""
    return {(kernel, key): why for (where, kernel, key), why in config_store.INVALID.items() if where == gpu_slug}


def detect_drift(fp: fingerprint.Fingerprint, policy: drift_mod.DriftPolicy | None = None,
                 root: Path | str | None = None, gpu_slug: str | None = None) -> drift_mod.DriftReport:
    gpu_slug = gpu_slug or fingerprint.gpu_slug(fp)
    configs_path, baseline_path = recorded_paths(gpu_slug, root)
    configs = config_store.load(configs_path) if configs_path.exists() else None
    configs_fp = configs.fingerprint if configs is not None else None
    unknown = sorted(set(configs.kernels) - registry.tuned_kernel_names()) if configs is not None else []
    if unknown:
        log.warning("%s: kernels: unknown kernel name(s) %s, whose configs no call uses (valid: the names of "
                    "`mamba2-guard list`'s Helion kernels)", configs_path, ", ".join(unknown))
    baseline_doc = baselines.read_document(baseline_path)
    baseline_fp = (baseline_doc or {}).get("fingerprint")
    report = drift_mod.classify(fp.to_dict(), configs_fp, baseline_fp, invalid_configs(gpu_slug), policy,
                                host_sources=fingerprint.HOST_SOURCES)
    borrowed = [] if configs is not None else config_store.borrowable_files(gpu_slug, fp.compute_capability,
                                                                            configs_path.parent)
    # Per kernel the runtime takes the first borrowable file holding it (config_store.serving_candidates).
    owners = list(dict.fromkeys(next(owner for owner, cf in borrowed if cf.kernels.get(kernel))
                                for _, cf in borrowed for kernel in cf.kernels if cf.kernels[kernel]))
    if owners:  # "no configs" would read as Helion's defaults: say what the jobs run on meanwhile
        names = " and ".join(f"{owner}'s" for owner in owners)
        per_kernel = " (for each kernel, the first of these with a config of it)" if len(owners) > 1 else ""
        report = dataclasses.replace(report, notes=report.notes + (
            f"until this GPU's configs are tuned, its jobs run on {names}{per_kernel} (same architecture, "
            f"compute capability {fp.compute_capability})",))
    return report


def rerun_on_device(options: CycleOptions, gpu_uuid: str | None = None) -> Any:
    """The confirmation re-run of one case, in this process (GPU only)."""
    if not torch.cuda.is_available():
        return None
    from mamba2_guard.bench.nvml import Nvml
    from mamba2_guard.bench.timing import Timer

    device = torch.device("cuda")
    timer, nvml = Timer(device), Nvml(torch.cuda.current_device(), uuid=gpu_uuid)
    loaded = suites.load()

    def rerun(case: CaseResult) -> CaseResult:
        return bench_case(registry.get(case.kernel), loaded.shape(case.shape), seed=options.seed + 1,
                          device=device, rounds=options.rounds, warmup=3, timer=timer, nvml=nvml, peaks={},
                          cuda_graphs=options.cuda_graphs)
    return rerun


def write_reports(state_dir: Path, stamp: str, result: BenchResult, verdicts: list[Verdict],
                  baseline, policy: Policy, *, save_result: bool = True,
                  earlier: Mapping[tuple[str, str], Sequence[float]] | None = None) -> dict[str, str]:
    """The reports of a judged result, and the result itself unless it is saved already (``check``). With
    timed cases that have a baseline, the Markdown report shows a trend chart beside it (``<stamp>-trend.svg``)
    of their speedups over ``earlier`` (``mamba2_guard.flows.check.earlier_speedups``) and this run."""
    reports = state_dir / "reports"
    paths = {"result": reports / f"{stamp}-result.json", "report_json": reports / f"{stamp}-report.json",
             "report_md": reports / f"{stamp}-report.md"}
    if save_result:
        atomic_write(paths["result"], json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n")
    else:
        del paths["result"]
    atomic_write(paths["report_json"], json.dumps(report.render_json(result, verdicts, baseline, policy),
                                                       indent=1, allow_nan=False) + "\n")
    chart = _trend_chart(reports / f"{stamp}-trend.svg", result, verdicts, baseline, policy, earlier or {})
    if chart:
        paths["trend_chart"] = chart
    atomic_write(paths["report_md"], report.render_markdown(result, verdicts, baseline,
                                                            chart=chart.name if chart else None))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:  # without the chart: a job summary cannot show a file of the runner's
        try:
            with open(summary, "a") as handle:
                handle.write(report.render_markdown(result, verdicts, baseline) + "\n")
        except OSError as exc:  # a full disk: name the file
            raise OSError(exc.errno, exc.strerror, summary) from exc
    return {k: str(v) for k, v in paths.items()}


def _trend_chart(path: Path, result: BenchResult, verdicts: list[Verdict], baseline, policy: Policy,
                 earlier: Mapping[tuple[str, str], Sequence[float]]) -> Path | None:
    """The report's trend chart at ``path``, or None where no case has a trend to draw (a CPU run, no
    baseline) or matplotlib is missing (said in the log: the report itself must not fail for a chart)."""
    from mamba2_guard.adapters import charts

    trends = report.speedup_trends(result, verdicts, baseline, earlier)
    if not trends:
        return None
    try:
        charts.speedup_trends(trends, policy.threshold, f"{result.suite or 'bench'}: speedup over the history "
                              f"window, relative to the baseline (band: the {policy.threshold:.0%} threshold)", path)
    except (ImportError, ValueError, RuntimeError) as exc:  # matplotlib missing, or data it cannot draw
        log.warning("the report has no trend chart: %s (matplotlib is a dependency of the guard extra)", exc)
        return None
    return path


def add_bring_up_section(paths: dict[str, str], progress: dict[str, Any]) -> None:
    """The bring-up's progress at the end of the report (and of its ``--out`` copy): it ran after the report
    was written, so that a bring-up that fails keeps the night's report."""
    from mamba2_guard.core import bringup

    section = f"\n## Bring-up of this GPU\n\n{bringup.render(progress)}\n"
    for key in ("report_md", "out_report_md"):
        if key in paths:
            atomic_write(Path(paths[key]), Path(paths[key]).read_text() + section)


def copy_reports(paths: dict[str, str], out_dir: Path) -> dict[str, str]:
    """Stable names for CI: report.md, report.json, result.json, and the trend chart by the name the report
    links it by."""
    copies = {}
    names = [("report_md", "report.md"), ("report_json", "report.json"), ("result", "result.json")]
    if "trend_chart" in paths:
        names.append(("trend_chart", Path(paths["trend_chart"]).name))
    for key, name in names:
        target = out_dir / name
        atomic_write(target, Path(paths[key]).read_text())
        copies[f"out_{key}"] = str(target)
    return copies


def tune_seconds_by_kernel(journal: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Seconds Helion's autotuner spent per kernel in one re-tune (from the autotune journal)."""
    seconds: dict[str, float] = {}
    for record in journal:
        for launch in record.get("launches") or ():
            if launch.get("tune_seconds") is not None:
                seconds[launch["kernel"]] = seconds.get(launch["kernel"], 0.0) + float(launch["tune_seconds"])
    return seconds


def export_metrics(state_dir: Path, result: BenchResult, verdicts: list[Verdict], fp: fingerprint.Fingerprint,
                   drift: drift_mod.DriftReport, steps: dict[str, Any]) -> dict[str, str]:
    """The snapshot the daemon's /metrics serves, and the node-exporter textfile of a one-shot run; drift and PR
    events carry this moment's timestamp (the dashboard's annotations)."""
    from mamba2_guard.adapters import metrics
    from mamba2_guard.adapters.state import StateDir

    now = _now().timestamp()
    events = {"drift": now} if drift.found else {}
    for event in ("retune", "pr"):
        if (steps.get(event) or {}).get("status") == "done":
            events[event] = now
    snapshot = metrics.write_snapshot(state_dir, result, verdicts, fingerprint=fp.to_dict(), drift=drift.to_dict(),
                                      events=events, autotune_s=(steps.get("retune") or {}).get("autotune_s"),
                                      bringup=(steps.get("bringup") or {}).get("progress"))
    exporter = metrics.GuardMetrics()
    exporter.load_snapshot(snapshot)
    textfile = StateDir(state_dir).textfile
    exporter.write_textfile(textfile)
    return {"metrics_snapshot": str(snapshot), "metrics_textfile": str(textfile)}


def daemon_cycle(state_dir: str | Path, reason: str | None = None, **options: Any) -> int:
    """The daemon's entry point (run in a child process): options by keyword, the exit code back."""
    known = {f.name for f in dataclasses.fields(CycleOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"daemon_cycle: unknown option(s) {unknown}; expected some of {sorted(known)}")
    if reason:
        plain_progress(f"cycle triggered by {reason}")
    try:
        return run_cycle(Path(state_dir), CycleOptions(**options), job="retune" if reason else "nightly").exit_code
    except CycleBusy as exc:
        plain_progress(f"skipped: {exc}")
        return EXIT_BUSY


def run_cycle(state_dir: Path, options: CycleOptions | None = None, progress: Progress = plain_progress,
              job: str = "nightly") -> CycleOutcome:
    options = options or CycleOptions()
    check_writable(state_dir)
    cfg = guard_config.load(options.config, state_dir)  # a bad file stops the cycle before it prints or locks
    with exclusive(state_dir / "nightly.lock", CycleBusy, "cycle"):
        configs, baseline = recorded_paths("any", options.root)
        for folder, recursive in ((state_dir, True), (configs.parent, False), (baseline.parent, False)):
            for path in clean_stale_temp_files(folder, recursive=recursive):
                progress(f"removed {path}, left by an interrupted write")
        return _cycle(state_dir, options, cfg, progress, job)


def _cycle(state_dir: Path, options: CycleOptions, cfg: guard_config.GuardConfig, progress: Progress,
           job: str) -> CycleOutcome:
    started = _now()
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    if not torch.cuda.is_available():
        from mamba2_kernels.testing import enable_cpu_interpret

        enable_cpu_interpret()
    fp = fingerprint.collect()
    gpu_slug = fingerprint.gpu_slug(fp)
    progress(f"fingerprint {fp.digest()[:12]} on {fp.gpu_name or 'CPU'} ({gpu_slug}): torch {fp.torch}, "
             f"triton {fp.triton}, helion {fp.helion}, mamba-ssm {fp.mamba_ssm}, driver {fp.driver_version}")
    suite, entries, shapes = selection(options, progress)
    progress(f"suite {suite}: {len(entries)} kernels x {len(shapes)} shapes "
             f"({sum(not e.has_helion for e in entries)} kernels not implemented yet)")
    from mamba2_guard.bench import shard

    # Before any GPU work: the baseline and the history (run_cycle checked the state dir and the config).
    policy = cfg.verdict_policy if options.policy == Policy() else options.policy
    baseline_path = recorded_paths(gpu_slug, options.root)[1]
    baseline = baselines.load(baseline_path)
    with History(state_dir / "history.sqlite") as history:
        bench = functools.partial(
            shard.bench, fingerprint=fp.to_dict(), fingerprint_digest=fp.digest(), state_dir=state_dir, suite=suite,
            seed=options.seed, rounds=options.rounds, progress=progress, cuda_graphs=options.cuda_graphs,
            workers=options.workers, bench_fn=options.bench_fn, case_timeout_s=options.case_timeout_s)
        result = bench(entries, shapes)
        zoo_entries, zoo_shapes = zoo_selection(options, torch.cuda.is_available())
        if zoo_shapes:
            progress(f"the model zoo: {len(zoo_entries)} whole calls x {len(zoo_shapes)} shapes")
            zoo = bench(zoo_entries, zoo_shapes)
            result = dataclasses.replace(result, cases=result.cases + zoo.cases)
        verdicts: list[Verdict] = []
        earlier: dict[tuple[str, str], list[float]] = {}
        try:
            # After the bench: it also reports configs the installed helion rejected.
            drift = detect_drift(fp, policy=cfg.drift_policy, root=options.root, gpu_slug=gpu_slug)
            progress(drift.render_text())
            # A sharded result re-runs a flagged case on the GPU that measured it (mamba2_guard.bench.shard).
            rerun = None
            if options.confirm:
                rerun = shard.rerun_on_measuring_gpu(
                    result, state_dir=state_dir, seed=options.seed, rounds=options.rounds,
                    cuda_graphs=options.cuda_graphs, fingerprint_digest=fp.digest(), progress=progress,
                    bench_fn=options.bench_fn, case_timeout_s=options.case_timeout_s)
                rerun = rerun or rerun_on_device(options, fp.gpu_uuid)
            windows = history_windows(result, history, policy)
            result, verdicts = run_check(result, baseline, windows, policy, rerun)
            earlier = earlier_speedups(result, windows)
        finally:  # the measured result and a report, whatever failed after the bench
            paths = write_reports(state_dir, stamp, result, verdicts, baseline, policy, earlier=earlier)
        code = exit_code(verdicts, missing_fails=options.strict)
        if options.out_dir:
            paths.update(copy_reports(paths, Path(options.out_dir)))
        if options.update_baseline:
            left_out = baselines.update(baseline_path, result)
            paths["baseline"] = str(baseline_path)
            if left_out:
                progress(f"not written to the baseline: {', '.join(left_out)}")
        steps = retune_or_bring_up(state_dir, stamp, options, cfg, fp, gpu_slug, drift, entries, shapes, paths,
                                   progress, result.cases)
        if (steps.get("bringup") or {}).get("progress"):
            add_bring_up_section(paths, steps["bringup"]["progress"])
        paths.update(export_metrics(state_dir, result, verdicts, fp, drift, steps))
        # A run in the history is a cycle whose measuring finished; the PR step comes after it, so that a
        # remote that fails or stalls loses neither the history nor the metrics.
        history.record(result, verdicts, _now(), job=job, status="pass" if code == 0 else "fail")
    due = steps.pop("pr_due", None)
    if due is not None:
        steps["pr"] = propose_configs(state_dir, stamp, options, cfg, fp, gpu_slug, drift, paths, progress, **due)
        paths.update(export_metrics(state_dir, result, verdicts, fp, drift, steps))  # with the PR's event
    return CycleOutcome(code, result, verdicts, drift, paths, steps)


def retune_plan(entries: Sequence[registry.KernelEntry], shapes: Sequence, seen: Sequence,
                fell_back: Sequence[str] = ()) -> tuple[list[str], list]:
    """The kernels and shapes a nightly re-tunes: the cycle's, plus the shapes training jobs called without a
    tuned config (``seen``, whose calls fell back at kernels ``fell_back``) with the entries that launch those
    calls' keys, call pattern included (``registry.seen_entries``)."""
    kernels = [e.name for e in entries if e.has_helion]
    if seen:
        kernels = list(dict.fromkeys([*kernels, *registry.seen_entries(fell_back)]))
    known = {shape.name for shape in shapes}
    return kernels, [*shapes, *(shape for shape in seen if shape.name not in known)]


def retune_or_bring_up(state_dir: Path, stamp: str, options: CycleOptions, cfg, fp: fingerprint.Fingerprint,
                       gpu_slug: str, drift: drift_mod.DriftReport, entries: Sequence[registry.KernelEntry],
                       shapes: Sequence, paths: dict[str, str], progress: Progress,
                       cases: Sequence[CaseResult] = ()) -> dict[str, Any]:
    """A new GPU's bring-up where one is due (``cases``: the night's bench, which orders and reports it), else
    a re-tune where the drift policy says so (GPU only); then
    whether the PR step is due (``steps["pr_due"]``, run by the cycle after the history and the metrics; a
    bring-up opens and updates its PR itself as stages land). None of these steps can fail the cycle: their
    problems are reported and recorded in the outcome's ``steps``."""
    steps: dict[str, Any] = {}
    configs_path, baseline_path = recorded_paths(gpu_slug, options.root)
    produced = bool(options.update_baseline)
    loaded = suites.load()
    if loaded.seen_problem:
        progress(f"warning: {loaded.seen_problem}; the calls it records are not re-tuned this cycle")
    seen = suites.seen_on(loaded, gpu_slug)
    propose = functools.partial(propose_configs, state_dir, stamp, options, cfg, fp, gpu_slug, drift, paths, progress)
    from mamba2_guard.flows import bringup as bring_up

    if torch.cuda.is_available() and bring_up.is_due(state_dir, gpu_slug, configs_path):
        produced = bring_up_step(state_dir, options, cfg, fp, gpu_slug, steps, propose, progress, cases,
                                 configs_path, baseline_path, paths) or produced
    elif drift.action == "retune" or options.force_retune or seen:
        why = drift.summary() if drift.action == "retune" else "forced" if options.force_retune else (
            f"{len(seen)} shapes called without a tuned config")
        tuned, shapes = retune_plan(entries, shapes, seen,
                                    [kernel for shape in seen for kernel, _ in loaded.seen_keys[shape.name]])
        if not torch.cuda.is_available():
            message = (f"re-tune needed ({why}) but there is no GPU here: re-tune skipped; run "
                       f"`mamba2-guard autotune` then `mamba2-guard pr` on a {gpu_slug} GPU runner")
            progress(message)
            steps["retune"] = {"status": "skipped", "detail": message}
        else:
            from mamba2_guard.bench import shard
            from mamba2_guard.flows import autotune

            try:
                opts = autotune.AutotuneOptions(
                    kernels=tuned, shapes=[s.name for s in shapes], out=configs_path, state_dir=state_dir,
                    gpu_slug=gpu_slug, fingerprint=fp.to_dict(), fingerprint_digest=fp.digest(),
                    devices=shard.visible_devices(), **autotune.config_options(cfg),
                    whole_suite=autotune.covers_whole_suite(tuned, [s.name for s in shapes]))
                progress(f"re-tune ({why}): {len(tuned)} kernels x {len(shapes)} shapes")
                outcome = autotune.run_autotune(opts, progress)
                steps["retune"] = {"status": "done", **outcome.to_dict(),
                                   "autotune_s": tune_seconds_by_kernel(outcome.entries)}
                if not outcome.complete:
                    done = outcome.summary
                    progress(f"re-tune partial: {done['ok']}/{done['jobs']} jobs done ({done['failed']} failed, "
                             f"{done['not_run']} not run); the next re-tune of this environment resumes it")
                produced = produced or outcome.written
                if outcome.changed:
                    steps["rebaseline"] = autotune.rebaseline(tuned, [s.name for s in shapes], state_dir, progress,
                                                              seed=options.seed, rounds=options.rounds,
                                                              path=baseline_path)
                    paths["baseline"] = str(baseline_path)
            except Exception as exc:  # noqa: BLE001 (the cycle's verdicts stand; the re-tune is reported)
                progress(f"re-tune failed: {type(exc).__name__}: {exc}")
                steps["retune"] = {"status": "error", "detail": f"{type(exc).__name__}: {exc}"}
    elif drift.action == "rebaseline" and not options.update_baseline:
        progress("drift policy asks for a re-baseline: run `mamba2-guard nightly --update-baseline` on this GPU")
    if not (options.pr and cfg.pr_enabled):
        steps["pr"] = {"status": "disabled"}
        return steps
    if (drift.found or produced) and (steps.get("pr") or {}).get("status") != "done":
        # Run by the cycle once the history and the metrics are written (``_cycle``).
        steps["pr_due"] = {"dry": not produced, "bring_up": (steps.get("bringup") or {}).get("progress")}
    return steps


def bring_up_step(state_dir: Path, options: CycleOptions, cfg, fp: fingerprint.Fingerprint, gpu_slug: str,
                  steps: dict[str, Any], propose: Callable[..., dict[str, Any]], progress: Progress,
                  cases: Sequence[CaseResult], configs_path: Path, baseline_path: Path, paths: dict[str, str]) -> bool:
    """The night's share of a new GPU's bring-up (``mamba2_guard.flows.bringup``) in the re-tune's budget: the
    config PR is opened after the first stage that stored configs and updated after each later one. The
    night's bench (``cases``) gives its progress the calls' speedups, and its searches the calls measured
    below mamba-ssm's to start with. Returns whether the config file was written."""
    from mamba2_guard.bench import shard
    from mamba2_guard.core import bringup as plan
    from mamba2_guard.flows import autotune
    from mamba2_guard.flows import bringup as bring_up

    budget = cfg.autotune_value("total_budget_seconds", None) or autotune.DEFAULT_TOTAL_BUDGET_SECONDS
    speedups = [c.speedup for c in cases if c.kernel in ZOO_ENTRIES and c.speedup]
    opts = bring_up.options_from_config(
        cfg, state_dir=state_dir, gpu_slug=gpu_slug, budget_seconds=float(budget), fingerprint=fp.to_dict(),
        fingerprint_digest=fp.digest(), out=configs_path, devices=shard.visible_devices(),
        tuner=os.environ.get(autotune.TUNER_ENV) or autotune.DEFAULT_TUNER,
        call_speedups=bring_up.call_speedups(cases))

    def on_configs(summary: dict[str, Any]) -> None:
        if options.pr and cfg.pr_enabled:
            steps["pr"] = propose(dry=False, bring_up=summary)

    try:
        outcome = bring_up.run_bring_up(opts, progress, on_configs=on_configs, speedups=speedups)
    except Exception as exc:  # noqa: BLE001 (the cycle's verdicts stand; the bring-up is reported)
        progress(f"bring-up failed: {type(exc).__name__}: {exc}")
        steps["bringup"] = {"status": "error", "detail": f"{type(exc).__name__}: {exc}"}
        return False
    summary = plan.progress(outcome.state, speedups)
    steps["bringup"] = {"status": "done" if outcome.complete else "partial", **outcome.to_dict(), "progress": summary}
    if outcome.complete and outcome.changed and opts.tuner == autotune.DEFAULT_TUNER:  # not after a test tuner
        tuned = [e.name for e in registry.select() if e.has_helion]
        steps["rebaseline"] = autotune.rebaseline(tuned, [s.name for s in suites.load().suite("default")], state_dir,
                                                  progress, seed=options.seed, rounds=options.rounds,
                                                  path=baseline_path)
        paths["baseline"] = str(baseline_path)
    return outcome.changed


def propose_configs(state_dir: Path, stamp: str, options: CycleOptions, cfg, fp: fingerprint.Fingerprint, gpu_slug: str,
                    drift: drift_mod.DriftReport, paths: dict[str, str], progress: Progress, *, dry: bool,
                    bring_up: dict[str, Any] | None = None) -> dict[str, Any]:
    """The PR step: open or update this GPU's config PR (``dry``: render it only); its ``steps`` record."""
    from mamba2_guard.flows import pr as prflow

    try:
        pr = prflow.run_pr(state_dir, cfg, fp.to_dict(), gpu_slug, root=Path(options.root) if options.root else
                           prflow.PROJECT_ROOT, dry_run=dry, drift=drift, progress=progress, bring_up=bring_up)
    except Exception as exc:  # noqa: BLE001
        progress(f"PR step failed: {type(exc).__name__}: {exc}")
        return {"status": "error", "detail": f"{type(exc).__name__}: {exc}"}
    body_path = state_dir / "reports" / f"{stamp}-pr.md"
    atomic_write(body_path, f"# {pr.title}\n\n{pr.body}\n\n```diff\n{pr.diff}```\n")
    paths["pr_body"] = str(body_path)
    if dry:
        progress("PR step dry: nothing new was produced in this cycle to propose; body and diff in " + str(body_path))
    for message in pr.messages:
        progress(f"PR: {message}")
    return {"status": "dry-run" if dry else "done", "branch": pr.branch, "origin": pr.origin,
            "git": pr.git, "github": pr.github, "messages": pr.messages}
