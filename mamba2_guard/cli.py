"""The ``mamba2-guard`` command line. Thin: each command composes the pieces of ``mamba2_guard``.

Exit codes (``EPILOG``): 0 all good, 1 a regression or precision failure, 2 a usage or environment error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mamba2_guard import EnvironmentProblem, __version__
from mamba2_guard.adapters import files
from mamba2_guard.adapters.state import default_state_dir
from mamba2_guard.core import flags

if TYPE_CHECKING:  # the CLI imports its commands' modules when they run
    from mamba2_guard.core.results import BenchResult

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
DESCRIPTION = """Benchmark, check and re-tune the Helion Mamba-2 kernels against mamba-ssm on this machine,
and propose new configs when the environment drifts."""
EPILOG = """exit codes:
  0  all good
  1  a regression, a precision failure or a kernel error (drift: drift found)
  2  a usage or environment error: a bad name or file, a missing dependency, a busy state directory

Each command has --help; the README lists them."""


def _console():
    from rich.console import Console

    # A terminal or $COLUMNS sets the width (rich reads both); a log without either gets wide tables.
    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(highlight=False, width=160 if wide else None)


def _use_cpu_interpret() -> bool:
    import torch

    return not torch.cuda.is_available()


def cmd_doctor(args: argparse.Namespace) -> int:
    """Installed versions and files only, nothing imported or compiled: fast. ``fingerprint`` has the rest."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    problems, versions = [], {}
    for dist in ("torch", "triton", "helion", "mamba-ssm", "einops"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            problems.append(f"{dist} is not installed (scripts/install.sh installs it)")
    if "mamba-ssm" in versions and not versions["mamba-ssm"].startswith("2.3."):
        problems.append(f"mamba-ssm {versions['mamba-ssm']} is installed; the guard compares with 2.3.x")
    spec = importlib.util.find_spec("mamba_ssm")
    locations = list(spec.submodule_search_locations or ()) if spec else []
    if "mamba-ssm" in versions and not any((Path(d) / "ops/triton/ssd_combined.py").is_file() for d in locations):
        problems.append("mamba-ssm has no ops/triton/ssd_combined.py (a broken install)")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if not args.quiet:
        print(f"mamba2-guard {__version__}: " + ", ".join(f"{d} {v}" for d, v in versions.items()))
        if not problems:
            print("mamba2-guard: environment ok (`mamba2-guard fingerprint` shows the whole environment)")
    return EXIT_USAGE if problems else EXIT_OK


def cmd_fingerprint(args: argparse.Namespace) -> int:
    from mamba2_guard.adapters import fingerprint

    fp = fingerprint.collect()
    data = fp.to_dict()
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return EXIT_OK
    from rich.table import Table

    table = Table(title=f"fingerprint {fp.digest()[:12]} ({fingerprint.gpu_slug(fp)})")
    table.add_column("field")
    table.add_column("value")
    for key, value in data.items():
        if key != "kernel_sources":
            table.add_row(key, "-" if value is None else str(value))
    _console().print(table)
    return EXIT_OK


def _selected(args: argparse.Namespace):
    from mamba2_kernels import registry, suites

    loaded = suites.load()
    if not args.shapes and args.suite == suites.SEEN_SUITE:
        _readable_seen_file(loaded, "--suite seen")
    shapes = [loaded.shape(s) for s in args.shapes] if args.shapes else loaded.suite(args.suite)
    return registry.select(args.kernels or None), shapes


def _readable_seen_file(loaded, flag: str) -> None:
    """A torn seen-keys file is named (exit 2), not taken for "no call fell back": what was seen is unknown."""
    if loaded.seen_problem:
        raise ValueError(f"{flag}: {loaded.seen_problem}")


def cmd_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    entries, shapes = _selected(args)
    # The shapes first: `list --suite seen` is how a user sees the calls their jobs made without a config.
    table = Table(title="shapes")
    for column in ("shape", "batch x seqlen", "heads x headdim", "groups", "dstate", "chunk", "dtype", "call"):
        table.add_column(column)
    for s in shapes:
        table.add_row(s.name, f"{s.batch} x {s.seqlen}", f"{s.nheads} x {s.headdim}", str(s.ngroups), str(s.dstate),
                      str(s.chunk_size), s.dtype, s.pattern or "plain")
    _console().print(table)

    def spread(values: list[float]) -> str:  # one shape: its value; several: their range
        low, high = min(values), max(values)
        return f"{low:.3g}" if f"{low:.3g}" == f"{high:.3g}" else f"{low:.3g}-{high:.3g}"

    table = Table(title="kernels" + (" (GB moved and GFLOP: the range over the shapes)" if len(shapes) > 1 else ""))
    for column in ("kernel", "family", "phase", "replaces", "helion", "GB moved", "GFLOP"):
        table.add_column(column)
    for entry in entries:
        status = "implemented" if entry.has_helion else "[red]missing[/red]"
        table.add_row(entry.name, entry.family, entry.phase, entry.replaces, status,
                      spread([entry.bytes_moved(s) / 1e9 for s in shapes]),
                      spread([entry.flops(s) / 1e9 for s in shapes]))
    _console().print(table)
    return EXIT_OK


def _progress():
    """A rich progress line on a terminal, plain lines in CI logs."""
    from mamba2_guard.bench.run import plain_progress

    if not sys.stderr.isatty():
        return plain_progress
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    return lambda message: console.print(message)


def _options(args: argparse.Namespace, **overrides):
    from mamba2_guard.flows.nightly import CycleOptions

    _selected(args)  # unknown names: exit 2 with the valid ones before anything runs
    return CycleOptions(suite=args.suite, shapes=args.shapes or (), kernels=args.kernels or (), seed=args.seed,
                        rounds=args.rounds, confirm=not getattr(args, "no_confirm", False),
                        strict=getattr(args, "strict", False),
                        update_baseline=getattr(args, "update_baseline", False), out_dir=getattr(args, "out", None),
                        force_retune=getattr(args, "force_retune", False), cuda_graphs=args.cuda_graphs,
                        workers=args.workers, bench_fn=args.bench_fn, case_timeout_s=args.case_timeout,
                        config=getattr(args, "config", None), **overrides)


def cmd_bench(args: argparse.Namespace) -> int:
    """Bench the selection; write the result JSON; optionally the baseline. Exit 1 on a precision failure
    or error (speed is judged by ``check``)."""
    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.bench import shard
    from mamba2_guard.flows import baselines
    from mamba2_guard.flows.nightly import selection
    from mamba2_kernels.files import atomic_write

    if args.resume and not args.json:
        raise ValueError("--resume: needs --json PATH, the result file to continue")
    progress = _progress()
    options = _options(args)
    if _use_cpu_interpret():
        from mamba2_kernels.testing import enable_cpu_interpret

        enable_cpu_interpret()
    suite, entries, shapes = selection(options, progress)
    fp = fingerprint.collect()
    state = Path(args.state_dir)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(args.json) if args.json else state / RESULTS_DIR / f"{stamp}{RESULT_SUFFIX}"
    resumed = _resumed(args, out, fp.to_dict()) if args.resume else None

    def write(result: BenchResult) -> None:  # after every case too: a killed run keeps what it measured
        atomic_write(out, json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n")

    result = shard.bench(entries, shapes, fingerprint=fp.to_dict(), fingerprint_digest=fp.digest(), state_dir=state,
                         suite=suite, seed=args.seed, rounds=args.rounds, progress=progress,
                         cuda_graphs=args.cuda_graphs, workers=args.workers, bench_fn=args.bench_fn,
                         case_timeout_s=args.case_timeout, resumed=resumed, checkpoint=write)
    write(result)
    from mamba2_guard.core import report

    _console().print(report.bench_table(result))
    print(f"result: {out} (`mamba2-guard check` judges it against the baseline)")
    if args.update_baseline:
        path = baselines.path_for(fingerprint.gpu_slug(fp))
        left_out = baselines.update(path, result)
        print(f"baseline: {path}" + (f" (left out: {', '.join(left_out)})" if left_out else ""))
    bad = [c for c in result.cases if c.error or (c.precision is not None and c.precision.ok is False)]
    return EXIT_FAIL if bad else EXIT_OK


def _resumed(args: argparse.Namespace, out: Path, fingerprint: dict[str, Any]) -> BenchResult | None:
    """``bench --resume``: the cases of ``out`` that this run keeps (None where the file is not there yet)."""
    import dataclasses

    from mamba2_guard.bench.timing import measured_under
    from mamba2_guard.core.results import kept_on_resume
    from mamba2_guard.flows import baselines

    if not out.exists():
        return None
    try:
        prior = baselines.read_result(out)
    except ValueError as exc:
        raise ValueError(f"--resume: {exc}") from None
    try:
        kept = kept_on_resume(prior, measured_under(fingerprint),
                              {"seed": args.seed, "rounds": args.rounds, "cuda_graphs": args.cuda_graphs})
    except ValueError as exc:
        raise ValueError(f"--resume: {out}: {exc}") from None
    return dataclasses.replace(prior, cases=kept)


# Where bench and nightly save results and where check finds the latest: <state>/reports/<stamp>-result.json.
RESULTS_DIR, RESULT_SUFFIX = "reports", "-result.json"


def _existing(flag: str, path: str) -> Path:
    if not Path(path).is_file():
        raise ValueError(f"{flag}: no such file: {path}")
    return Path(path)


def cmd_check(args: argparse.Namespace) -> int:
    """Verdicts for a saved bench result against the baseline and the history."""
    from mamba2_guard.adapters.history import History
    from mamba2_guard.core import report
    from mamba2_guard.core.verdicts import exit_code
    from mamba2_guard.flows import baselines
    from mamba2_guard.flows.check import run_check
    from mamba2_guard.flows.nightly import write_reports

    policy = _guard_config(args).verdict_policy  # as the nightly judges; a bad file stops here, before reading
    state = Path(args.state_dir)
    baseline_path = _existing("--baseline", args.baseline) if args.baseline else None
    if args.result:
        result_path = _existing("--result", args.result)
    else:
        saved = sorted((state / RESULTS_DIR).glob(f"*{RESULT_SUFFIX}"))
        if not saved:
            raise ValueError(f"--result: no saved bench result under {state / RESULTS_DIR}; run `mamba2-guard bench` "
                             "or `mamba2-guard nightly`")
        result_path = saved[-1]
    try:
        result = baselines.read_result(result_path)
    except ValueError as exc:
        raise ValueError(f"--result: {exc}") from None
    baseline_path = baseline_path or baselines.path_for_result(result)
    baseline = baselines.load(baseline_path)
    if baseline is None and args.baseline:  # named, yet empty: "no baseline" would judge nothing
        raise ValueError(f"--baseline: {baseline_path}: empty; expected a baseline (fingerprint, results)")
    with History(state / "history.sqlite") as history:
        result, verdicts = run_check(result, baseline, history, policy)
        code = exit_code(verdicts, missing_fails=args.strict)
        history.record(result, verdicts, datetime.datetime.now(datetime.timezone.utc), job="check",
                       status="pass" if code == 0 else "fail")
    paths = write_reports(state, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), result, verdicts, baseline, policy)
    _console().print(report.rich_table(result, verdicts, baseline))
    print(f"report: {paths['report_md']}")
    if isinstance(partial := result.extra.get("partial"), dict):
        print(f"note: {result_path} holds {partial.get('cases')} of the {partial.get('planned')} planned cases: "
              f"its bench stopped early; the same command with --resume --json {result_path} measures the rest")
    return code


def cmd_nightly(args: argparse.Namespace) -> int:
    """One cycle: fingerprint, bench, check with confirming re-runs, drift, reports, history."""
    from mamba2_guard.flows.nightly import CycleBusy, run_cycle

    state = Path(args.state_dir)
    print(f"state directory: {state}")
    try:
        outcome = run_cycle(state, _options(args), progress=_progress())
    except CycleBusy as exc:
        raise EnvironmentProblem(str(exc)) from exc
    from mamba2_guard.core import report

    _console().print(report.rich_table(outcome.result, outcome.verdicts, None))
    for name, path in outcome.paths.items():
        print(f"{name}: {path}")
    return outcome.exit_code


def _guard_config(args: argparse.Namespace):
    from mamba2_guard import config as guard_config

    try:
        return guard_config.load(getattr(args, "config", None), getattr(args, "state_dir", None))
    except guard_config.GuardConfigError as exc:
        raise EnvironmentProblem(str(exc)) from None


def cmd_drift(args: argparse.Namespace) -> int:
    """The current fingerprint against the ones recorded with the configs and the baseline. Exit 1 when
    drift that calls for an action (re-tune or re-baseline, by the guard config's policy) is found."""
    import dataclasses

    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.flows.nightly import detect_drift, recorded_paths

    cfg = _guard_config(args)
    fp = fingerprint.collect()
    slug = args.gpu_slug or fingerprint.gpu_slug(fp)
    root = Path(args.root) if args.root else None
    report = detect_drift(fp, policy=cfg.drift_policy, root=root, slug=slug)
    report = dataclasses.replace(report, notes=report.notes + (
        "stored configs are checked against the installed helion when kernels run (bench, nightly)",))
    configs_path, baseline_path = recorded_paths(slug, root)
    if args.json:
        doc = {"gpu_slug": slug, "fingerprint_digest": fp.digest(), "configs": str(configs_path),
               "baseline": str(baseline_path), "config": cfg.describe(), "policy": cfg.drift_policy.to_dict(),
               "summary": report.summary(), **report.to_dict()}
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print(f"configs: {configs_path}{'' if configs_path.exists() else ' (none)'}")
        print(f"baseline: {baseline_path}{'' if baseline_path.exists() else ' (none)'}")
        print(report.render_text())
        if report.found:
            print(f"action: {report.action} ({report.summary()})")
    return EXIT_FAIL if report.found else EXIT_OK


def cmd_autotune(args: argparse.Namespace) -> int:
    """Tune kernels x shapes in child processes (sharded over the GPUs), validate each winner, write the
    config store, then re-baseline. Exit 1 when a job failed or the budget left jobs undone."""
    import torch

    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.bench.shard import visible_devices
    from mamba2_guard.flows.autotune import (
        DEFAULT_TUNER,
        TUNER_ENV,
        AutotuneBusy,
        AutotuneOptions,
        config_options,
        covers_whole_suite,
        rebaseline,
        rich_bar,
        run_autotune,
    )
    from mamba2_kernels import config_store, registry, suites

    cfg = _guard_config(args)
    loaded = suites.load()  # names first: a typo is answered with the valid names, on any machine
    fp = fingerprint.collect()
    slug = args.gpu_slug or fingerprint.gpu_slug(fp)
    if args.fit_selection:
        from mamba2_guard.flows import selection as rule

        path = Path(args.out) if args.out else config_store.path_for(slug)
        try:
            fits = rule.fit_into(path, Path(args.fit_selection))
        except ValueError as exc:
            raise EnvironmentProblem(str(exc)) from exc
        for fit in fits:
            print(fit.describe())
        print(f"wrote {path}")
        return 0
    if args.seen:
        _readable_seen_file(loaded, "--seen")
        args.shapes = [s.name for s in suites.seen_on(loaded, slug)]
        if not args.shapes:
            print(f"nothing seen to tune on {slug}: no call fell back since the last tune (the seen-keys file)")
            return 0
        args.kernels = args.kernels or registry.seen_entries(
            kernel for name in args.shapes for kernel, _ in loaded.seen_keys[name])
    entries = registry.select(args.kernels or None)
    shapes = [loaded.shape(s).name for s in args.shapes] if args.shapes else [s.name for s in loaded.suite(args.suite)]
    tuner = args.tuner or os.environ.get(TUNER_ENV) or DEFAULT_TUNER
    real = tuner == DEFAULT_TUNER
    if real and not torch.cuda.is_available():
        raise EnvironmentProblem("autotune needs a CUDA GPU and none is visible; run it on a GPU runner "
                                 "(`mamba2-guard drift` says whether a re-tune is due)")
    missing = [e.name for e in entries if not e.has_helion]
    if missing:
        print(f"not implemented in Helion yet (skipped): {', '.join(missing)}", file=sys.stderr)
    out = Path(args.out) if args.out else config_store.path_for(slug)
    fields = config_options(cfg)
    if args.margin is not None:
        fields["criteria"] = type(cfg.criteria)(**{**cfg.criteria.to_dict(), "margin": args.margin})
    flags = {"effort": args.effort, "seed": args.seed, "budget_seconds": args.budget_seconds,
             "total_budget_seconds": args.total_budget_seconds, "job_timeout_seconds": args.job_timeout}
    fields.update({k: v for k, v in flags.items() if v is not None})
    opts = AutotuneOptions(
        kernels=[e.name for e in entries if e.has_helion], shapes=shapes, out=out, state_dir=Path(args.state_dir),
        gpu_slug=slug, fingerprint=fp.to_dict(), fingerprint_digest=fp.digest(),
        devices=visible_devices(args.workers), tuner=tuner, fresh=args.fresh,
        missing_only=args.missing_only or args.seen,
        whole_suite=covers_whole_suite([e.name for e in entries], shapes), **fields)
    with rich_bar(sys.stderr.isatty()) as (on_start, on_job, log):
        progress = log or _progress()
        try:
            outcome = run_autotune(opts, progress, on_job=on_job, on_start=on_start)
        except AutotuneBusy as exc:
            raise EnvironmentProblem(str(exc)) from None
    s = outcome.summary
    print(f"autotune: {s['ok']}/{s['jobs']} jobs ok, {s['failed']} failed, {s['not_run']} not run; "
          f"{s['kept']} winner(s) kept, {s['rejected']} rejected (old config kept)")
    print(f"configs: {outcome.out}" + (" (changed)" if outcome.changed else " (no config changed)"))
    print(f"run directory (journal, logs): {outcome.run_dir}")
    if outcome.changed and real and not args.no_rebaseline:
        if out.resolve() != config_store.path_for(slug).resolve():
            print("re-baseline skipped: --out is not the config store the kernels read")
        else:
            done = rebaseline(opts.kernels, shapes, Path(args.state_dir), progress)
            failed = f" (failed: {', '.join(done['failed'])})" if done["failed"] else ""
            print(f"baseline: {done['baseline']}{failed}")
    elif outcome.changed and not real:
        print("re-baseline skipped: a test tuner was used")
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=1, sort_keys=True))
    return EXIT_FAIL if s["failed"] or s["not_run"] else EXIT_OK


def _with_pr_overrides(cfg, args: argparse.Namespace):
    """The guard config with the PR target given on the command line (the workflow passes its own repo)."""
    import dataclasses

    if args.repo is not None and (args.repo.count("/") != 1 or not all(args.repo.split("/"))):
        raise ValueError(f"--repo: expected OWNER/NAME, got {args.repo!r}")
    github = {**cfg.github, **({"repo": args.repo} if args.repo else {}),
              **({"base_url": args.api_url} if args.api_url else {})}
    git = {**cfg.git, **({"origin": args.origin} if args.origin else {})}
    return dataclasses.replace(cfg, github=github, git=git)


def cmd_pr(args: argparse.Namespace) -> int:
    """Open or update the config PR for this GPU (``--dry-run``: print body and diff, push nothing)."""
    from mamba2_guard import PROJECT_ROOT
    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.flows.pr import run_pr

    cfg = _with_pr_overrides(_guard_config(args), args)
    fp = fingerprint.collect()
    slug = args.gpu_slug or fingerprint.gpu_slug(fp)
    try:
        outcome = run_pr(Path(args.state_dir), cfg, fp.to_dict(), slug,
                         root=Path(args.root) if args.root else PROJECT_ROOT, dry_run=args.dry_run)
    except RuntimeError as exc:
        print(f"mamba2-guard: pr: {exc}", file=sys.stderr)
        return EXIT_FAIL
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=1, sort_keys=True, default=str))
        return EXIT_OK
    if args.dry_run and not outcome.diff:
        print("\n".join(outcome.messages))
        return EXIT_OK
    print(f"title: {outcome.title}\nbranch: {outcome.branch} -> {outcome.base_branch} of {outcome.origin}\n")
    print(outcome.body)
    print("--- diff ---")
    print(outcome.diff or "(no differences)")
    for message in outcome.messages:
        print(message)
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    """``config check [PATH]``: 0 when the file is valid (or absent, for the default path), 2 naming the key."""
    from mamba2_guard import config as guard_config

    path = Path(args.path) if args.path else Path(args.state_dir) / guard_config.FILE_NAME
    if args.path is None and not path.exists():
        print(f"{path}: no such file; the embedded defaults apply")
        return EXIT_OK
    guard_config.load(path)  # a GuardConfigError is a ValueError: main() prints it, exit 2
    print(f"{path}: ok")
    return EXIT_OK


def _workers_arg(value: str):
    from mamba2_guard.bench.shard import parse_workers

    try:
        return parse_workers(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("workers: ")) from None


def cmd_daemon(args: argparse.Namespace) -> int:
    from mamba2_guard import daemon

    if args.nightly_target == daemon.NIGHTLY_TARGET:  # a test target takes its own options
        unknown = sorted({key for key, _ in args.option} - set(NIGHTLY_OPTIONS))
        if unknown:
            raise ValueError(f"-o: unknown option(s) {', '.join(unknown)}; valid: {', '.join(NIGHTLY_OPTIONS)}")
        for key, value in args.option:
            _check_nightly_option(key, value)
    return daemon.cmd_daemon(args)


def _check_nightly_option(key: str, value: Any) -> None:
    """A ``daemon -o`` value as the nightly's own flag would take it, at start: otherwise every scheduled
    cycle would fail on it, night after night."""
    from mamba2_guard import config as guard_config
    from mamba2_kernels import registry, suites

    numbers = {"rounds": flags.integer(1), "seed": flags.integer(0), "case_timeout_s": flags.seconds(),
               "workers": _workers_arg}
    try:
        if key in numbers:
            numbers[key](str(value))
        elif key in ("confirm", "strict", "update_baseline", "force_retune", "cuda_graphs", "pr"):
            if not isinstance(value, bool):
                raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")
        elif key in ("shapes", "kernels"):
            if not (isinstance(value, list) and all(isinstance(name, str) for name in value)):
                raise argparse.ArgumentTypeError(f"expected a list of names such as [a, b], got {value!r}")
            if key == "kernels":
                registry.select(value)
            else:
                loaded = suites.load()
                for name in value:
                    loaded.shape(name)
        elif key == "suite":
            suites.load().suite(str(value))
        elif key in ("out_dir", "config") and value is not None:  # null: none
            if not isinstance(value, str):
                raise argparse.ArgumentTypeError(f"expected a path, got {value!r}")
            if key == "config":
                guard_config.load(value)
            else:
                files.creatable_directory(value)
    except (argparse.ArgumentTypeError, KeyError, ValueError) as exc:
        raise ValueError(f"-o {key}: {exc.args[0] if exc.args else exc}") from None


# The nightly's settings that `daemon -o KEY=VALUE` passes on (mamba2_guard.flows.nightly.CycleOptions).
NIGHTLY_OPTIONS = ("suite", "shapes", "kernels", "seed", "rounds", "confirm", "strict", "update_baseline", "out_dir",
                   "force_retune", "cuda_graphs", "config", "pr", "workers", "case_timeout_s")


def _option(text: str) -> tuple[str, Any]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.replace("-", "_"), yaml.safe_load(value)


def _crontab(text: str) -> str:
    """A crontab line APScheduler takes (five fields, UTC), checked before the daemon starts."""
    from apscheduler.triggers.cron import CronTrigger

    try:
        CronTrigger.from_crontab(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a crontab line (minute hour day month weekday), got {text!r}: "
                                         f"{exc}") from None
    return text


def _daemon_arguments(parser: argparse.ArgumentParser) -> None:
    from mamba2_guard.daemon import DEFAULT_METRICS_PORT, DEFAULT_NIGHTLY_CRON, DRIFT_TARGET, NIGHTLY_TARGET

    _state_dir_argument(parser)
    parser.add_argument("--nightly-cron", type=_crontab, default=DEFAULT_NIGHTLY_CRON,
                        help="crontab, UTC (default: %(default)s)")
    parser.add_argument("--nightly-interval", type=flags.seconds(), metavar="S",
                        help="run the nightly every S seconds instead")
    parser.add_argument("--nightly-timeout", type=flags.seconds(), default=6 * 3600, metavar="S",
                        help="hard timeout of one cycle (default: %(default)s)")
    parser.add_argument("--nightly-target", default=NIGHTLY_TARGET, help=argparse.SUPPRESS)
    parser.add_argument("--option", "-o", action="append", type=_option, default=[], metavar="KEY=VALUE",
                        help="a nightly setting (YAML value), repeatable, e.g. -o suite=default -o rounds=50; "
                             f"keys: {', '.join(NIGHTLY_OPTIONS)}")
    parser.add_argument("--drift-interval", type=flags.seconds(), default=900, metavar="S", help="default: %(default)s")
    parser.add_argument("--drift-timeout", type=flags.seconds(), default=300, metavar="S", help="default: %(default)s")
    parser.add_argument("--drift-target", default=DRIFT_TARGET, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-interval", type=flags.seconds(), default=60, metavar="S", help=argparse.SUPPRESS)
    parser.add_argument("--metrics-port", type=flags.integer(0, 65535), default=DEFAULT_METRICS_PORT,
                        help="/metrics port, 0 = none (default: %(default)s)")
    parser.add_argument("--metrics-addr", default="127.0.0.1",
                        help="bind address (default: %(default)s; 0.0.0.0 for a remote Prometheus)")
    parser.add_argument("--misfire-grace", type=flags.seconds(), default=6 * 3600, metavar="S",
                        help="default: %(default)s")
    parser.add_argument("--shutdown-grace", type=flags.seconds(zero=True), default=120, metavar="S",
                        help="on SIGTERM, wait this long for a running job before killing it (default: %(default)s)")
    parser.add_argument("--kill-grace", type=flags.seconds(zero=True), default=10, metavar="S",
                        help="between SIGTERM and SIGKILL of a child (default: %(default)s)")
    parser.add_argument("--no-catch-up", action="store_true", help="do not run a missed nightly at start")


def _metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``mamba2-guard metrics {textfile,push,show}`` (the CLI wires this in)."""
    parser.add_argument("action", choices=("textfile", "push", "show"),
                        help="textfile: write the node-exporter file; push: send to a Pushgateway; show: print")
    _state_dir_argument(parser)
    parser.add_argument("--snapshot", help="a latest.json to read (default: <state-dir>/latest.json)")
    parser.add_argument("--path", help="textfile path (default: <state-dir>/metrics/mamba2_guard.prom)")
    parser.add_argument("--gateway", help="Pushgateway URL (default: $MAMBA2_GUARD_PUSHGATEWAY)")
    parser.add_argument("--job", default="mamba2-guard", help="Pushgateway job name (default: %(default)s)")


def cmd_metrics(args: argparse.Namespace) -> int:
    """Exit 0 on success, 2 when there is nothing to export or no gateway is given."""
    from mamba2_guard.adapters.metrics import GuardMetrics
    from mamba2_guard.adapters.state import StateDir, load_daemon_state

    state = StateDir(Path(args.state_dir))
    m = GuardMetrics()
    source = Path(args.snapshot) if args.snapshot else state.latest
    problem = m.read_snapshot(source)
    if problem:
        print(f"mamba2-guard: {'--snapshot: ' if args.snapshot else ''}no usable snapshot at {source}: {problem} "
              "(run a cycle first)", file=sys.stderr)
        return 2
    if state.daemon_state.exists():
        m.restore(load_daemon_state(state)[0])
    if args.action == "show":
        sys.stdout.write(m.exposition().decode())
    elif args.action == "textfile":
        path = Path(args.path) if args.path else state.textfile
        m.write_textfile(path)
        print(f"metrics: wrote {path}")
    else:
        url = args.gateway or os.environ.get("MAMBA2_GUARD_PUSHGATEWAY")
        if not url:
            print("mamba2-guard: no Pushgateway (--gateway or MAMBA2_GUARD_PUSHGATEWAY)", file=sys.stderr)
            return 2
        try:
            m.push(url, args.job)
        except OSError as exc:
            raise EnvironmentProblem(f"Pushgateway {url}: {_os_error(exc)}") from None
        print(f"metrics: pushed to {url} (job {args.job})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mamba2-guard", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        """A subcommand whose help line is also its description (``COMMAND --help`` opens with it)."""
        return commands.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")

    def selection(p: argparse.ArgumentParser, suite: str) -> None:
        which = p.add_mutually_exclusive_group()  # both given: one would be dropped without a word
        which.add_argument("--suite", default=suite, metavar="NAME",
                           help=f"shape suite from mamba2_kernels/suites.yaml (default: the suite '{suite}')")
        which.add_argument("--shapes", nargs="+", metavar="SHAPE", help="shape names instead of a suite")
        p.add_argument("--kernels", nargs="+", metavar="KERNEL", help="kernel names (default: all)")

    p = command("doctor", "check the installation quickly: versions and files, nothing compiled")
    p.add_argument("--quiet", action="store_true", help="print only problems")
    p.set_defaults(func=cmd_doctor)

    p = command("fingerprint", "print the environment fingerprint")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fingerprint)

    p = command("list", "list kernels and shapes of a suite")
    selection(p, "default")
    p.set_defaults(func=cmd_list)

    def run_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--seed", type=flags.integer(0), default=0,
                       help="input seed, recorded in the result (default: %(default)s)")
        p.add_argument("--rounds", type=flags.integer(1), default=30,
                       help="timed samples per implementation (default: %(default)s)")
        p.add_argument("--cuda-graphs", action="store_true",
                       help="time every entry as CUDA-graph replays (L2 still flushed before each): device work "
                            "without host overhead; whole calls and the layer are always timed so")
        _state_dir_argument(p)
        p.add_argument("--workers", type=_workers_arg, default=1, metavar="N|auto",
                       help="bench workers, one per GPU (child processes; auto: all visible GPUs; default 1)")
        p.add_argument("--case-timeout", type=flags.seconds(), default=1800.0, metavar="S",
                       help="with --workers: kill a worker that finishes no case for S seconds (default 1800)")
        p.add_argument("--bench-fn", help=argparse.SUPPRESS)  # module:function or file.py:function (tests)

    p = command("bench", "precision and interleaved timing of kernels x shapes")
    selection(p, "default")
    run_options(p)
    p.add_argument("--json", metavar="PATH", type=files.creatable_file,
                   help="where to write the result (default: the state dir); "
                   "rewritten after every case")
    p.add_argument("--resume", action="store_true", help="continue --json PATH where a stopped run left it: keep "
                   "its cases (same environment, GPU, seed, rounds and timing) and measure the rest, and again "
                   "those that failed or ran throttled")
    p.add_argument("--update-baseline", action="store_true", help="write baselines/<gpu-slug>.yaml")
    p.set_defaults(func=cmd_bench)

    p = command("check", "verdicts for a bench result against baseline and history")
    p.add_argument("--result", metavar="PATH", help="a bench result JSON (default: the latest in the state dir)")
    p.add_argument("--baseline", metavar="PATH", help="default: baselines/<gpu-slug>.yaml")
    _state_dir_argument(p)
    p.add_argument("--strict", action="store_true", help="kernels not implemented yet fail the check")
    p.add_argument("--config", metavar="PATH", help="guard config whose policy judges (default: "
                   "<state-dir>/guard.yaml if present)")
    p.set_defaults(func=cmd_check)

    p = command("nightly", "one nightly cycle: bench, check, drift, re-tune and PR where due, reports")
    selection(p, "default")
    run_options(p)
    p.add_argument("--no-confirm", action="store_true", help="do not re-run flagged cases")
    p.add_argument("--strict", action="store_true", help="kernels not implemented yet fail the cycle")
    p.add_argument("--update-baseline", action="store_true", help="also write baselines/<gpu-slug>.yaml")
    p.add_argument("--out", metavar="DIR", type=files.creatable_directory,
                   help="also copy report.md, report.json and result.json here")
    p.add_argument("--force-retune", action="store_true", help="re-tune even without drift")
    p.add_argument("--config", metavar="PATH", help="guard config (default: <state-dir>/guard.yaml if present)")
    p.set_defaults(func=cmd_nightly)

    p = command("daemon", "scheduled nightly, drift watch and /metrics (APScheduler)")
    _daemon_arguments(p)
    p.set_defaults(func=cmd_daemon)

    p = command("metrics", "export the last cycle's metrics: textfile | push | show")
    _metrics_arguments(p)
    p.set_defaults(func=cmd_metrics)

    def guard_options(p: argparse.ArgumentParser) -> None:
        _state_dir_argument(p)
        p.add_argument("--config", metavar="PATH", help="guard config (default: <state-dir>/guard.yaml if present)")
        p.add_argument("--gpu-slug", metavar="SLUG", type=flags.gpu_slug,
                       help="config/baseline file name (default: this GPU's)")

    p = command("drift", "what changed since the configs and baseline were recorded (exit 1: drift)")
    guard_options(p)
    p.add_argument("--root", metavar="DIR", type=files.existing_directory,
                   help="checkout holding mamba2_kernels/configs and baselines (default: this one)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_drift)

    p = command("autotune", "tune, validate and store Helion configs (child processes, resumable)")
    selection(p, "default")
    guard_options(p)
    p.add_argument("--effort", choices=("quick", "full"), help="Helion's autotune effort (default: quick)")
    p.add_argument("--seed", type=flags.integer(0), help="autotuner random seed, recorded in the file (default: 1234)")
    p.add_argument("--budget-seconds", type=flags.seconds(), metavar="N",
                   help="Helion's search per kernel x shape job (default: 10, a warm re-tune; a new GPU's first "
                        "tune deserves ~300)")
    p.add_argument("--total-budget-seconds", type=flags.seconds(), metavar="N",
                   help="whole run (default: 1800): a job starts only while its --budget-seconds still fit (it "
                        "then runs to its own timeout); rerun to resume the rest")
    p.add_argument("--job-timeout", type=flags.seconds(), metavar="S",
                   help="hard kill of a job (default: 2 x budget + 120)")
    p.add_argument("--workers", type=flags.integer(1), metavar="N",
                   help="parallel workers, one per GPU (default: all GPUs)")
    p.add_argument("--margin", type=flags.fraction,
                   help="a winner must beat the committed config by this (default 0.02)")
    p.add_argument("--out", metavar="PATH", help="config file (default: mamba2_kernels/configs/<gpu-slug>.yaml)")
    p.add_argument("--fresh", action="store_true", help="ignore the journal of an earlier run of the same plan")
    p.add_argument("--no-rebaseline", action="store_true", help="do not bench and write the baseline afterwards")
    p.add_argument("--fit-selection", metavar="MEASUREMENTS",
                   help="fit the config-selection rule to `dev measure-selection`'s file and write it, with the "
                        "grid's best configs and the state passes' chain rules, into the config file (no GPU; "
                        "docs/config-selection.md)")
    p.add_argument("--seen", action="store_true",
                   help="tune the shapes training jobs called without a tuned config (the seen-keys file's 'seen' "
                        "suite; kernels: the whole SSD call's; implies --missing-only)")
    p.add_argument("--missing-only", action="store_true",
                   help="search only the launches whose shape key has no config of its own in the file (extend "
                        "coverage to new shapes without re-searching tuned keys)")
    p.add_argument("--json", action="store_true", help="also print the outcome as JSON")
    p.add_argument("--tuner", help=argparse.SUPPRESS)  # module:function or file.py:function (tests)
    p.set_defaults(func=cmd_autotune)

    p = command("pr", "open or update the config PR for this GPU")
    guard_options(p)
    p.add_argument("--root", metavar="DIR", type=files.existing_directory,
                   help="checkout holding the files to propose (default: this one)")
    p.add_argument("--dry-run", action="store_true", help="print the body and the diff; push nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--repo", metavar="OWNER/NAME", help="GitHub repository (overrides github.repo)")
    p.add_argument("--origin", metavar="URL", help="git remote to push to (overrides git.origin)")
    p.add_argument("--api-url", metavar="URL", type=_url,
                   help="GitHub REST base URL, for Enterprise (overrides github.base_url)")
    p.set_defaults(func=cmd_pr)

    p = command("config", "the guard's settings file (guard.yaml)")
    p.add_argument("action", choices=("check",), help="check: validate the file (exit 2 names the bad key)")
    p.add_argument("path", nargs="?", metavar="PATH", help="the file (default: <state-dir>/guard.yaml)")
    _state_dir_argument(p)
    p.set_defaults(func=cmd_config)

    from mamba2_guard import dev
    from mamba2_guard.commands import bring_up

    bring_up.register(commands)
    dev.register(commands)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (subcommand parsers inherit the class): exit 2 naming the flag."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see --help)\n")


def _url(text: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected an http(s)://host URL, got {text!r}")
    return text


def _state_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=files.creatable_directory, default=str(default_state_dir()),
                        help="default: %(default)s")


def _seen_file(text: str) -> str:
    """``$MAMBA2_GUARD_SEEN``: ``off``, or a file path (one there, or one that can be created)."""
    return text if text.strip().lower() == "off" else files.creatable_file(text, "the seen-keys file or off")


def _target(text: str) -> str:
    if text.count(":") != 1 or not all(text.split(":")):
        raise argparse.ArgumentTypeError(f"expected module:function or file.py:function, got {text!r}")
    return text


def _check_environment() -> None:
    """The guard's environment variables, checked before anything runs (exit 2 naming the variable)."""
    from mamba2_guard.bench.worker import BENCH_ENV
    from mamba2_guard.flows.autotune import TUNER_ENV
    from mamba2_kernels.seen import SEEN_ENV

    checks = {"MAMBA2_GUARD_STATE": files.creatable_directory, SEEN_ENV: _seen_file, "MAMBA2_GUARD_PUSHGATEWAY": _url,
              TUNER_ENV: _target, BENCH_ENV: _target}
    for name, check in checks.items():
        value = os.environ.get(name)
        if value is None:
            continue
        try:
            if not value.strip():
                raise argparse.ArgumentTypeError("is set but empty")
            check(value)
        except argparse.ArgumentTypeError as exc:
            raise EnvironmentProblem(f"${name}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0, 1 (a regression or precision failure) or 2 (usage or environment, one line naming the file
    or flag). ``docs/failure-model.md`` lists what each code means."""
    from mamba2_guard.adapters.history import HistoryError
    from mamba2_kernels import seen

    seen.stop_recording()
    try:
        _check_environment()
        parser = build_parser()
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        return args.func(args)
    except (EnvironmentProblem, HistoryError) as exc:
        return _usage_error(exc)
    except OSError as exc:  # disk full, read-only, a path under a file, a host that does not answer
        return _usage_error(_os_error(exc))
    except (KeyError, ValueError) as exc:
        return _usage_error(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)


def _usage_error(message: object) -> int:
    """Print ``message`` on one line (a YAML parser's, for one, spans several with a caret) and return 2."""
    print(f"mamba2-guard: {' '.join(str(message).split())}", file=sys.stderr)
    return EXIT_USAGE


def _os_error(exc: OSError) -> str:
    """One line naming the file (or the URL's reason) of an OSError."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    reason = exc.strerror or str(getattr(exc, "reason", None) or exc)
    return f"{where}: {reason}" if where else reason
