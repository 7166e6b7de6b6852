"""``mamba2-guard autotune``: tune, validate and store Helion configs in child processes, resumable."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mamba2_guard import EnvironmentProblem
from mamba2_guard.commands import common
from mamba2_guard.core import flags


def register(commands) -> None:
    p = common.add_command(commands, "autotune", "tune, validate and store Helion configs (child processes, resumable)")
    common.selection_arguments(p, "default")
    common.guard_arguments(p)
    p.add_argument("--effort", choices=("quick", "full"), help="Helion's autotune effort (default: quick)")
    p.add_argument("--seed", type=flags.integer(0), help="autotuner random seed, recorded in the file (default: 1234)")
    p.add_argument("--budget-seconds", type=flags.seconds(), metavar="N",
                   help="Helion's search per kernel x shape job (default: 10, a warm re-tune; a new GPU gets "
                        "`mamba2-guard bring-up`)")
    p.add_argument("--total-budget-seconds", type=flags.seconds(), metavar="N",
                   help="whole run (default: 1800): a job starts only while the time its kernel's jobs took on "
                        "this GPU, at least --budget-seconds, still fits (it then runs to its own timeout); rerun "
                        "to resume the rest")
    p.add_argument("--job-timeout", type=flags.seconds(), metavar="S",
                   help="hard kill of a job (default: 2 x budget + 120)")
    p.add_argument("--workers", type=flags.integer(1), metavar="N",
                   help="parallel workers, one per GPU (default: all GPUs)")
    p.add_argument("--margin", type=flags.fraction,
                   help="a winner must beat the committed config by this (default 0.02)")
    p.add_argument("--out", metavar="PATH", help="config file (default: mamba2_kernels/configs/<gpu-slug>.yaml)")
    p.add_argument("--fresh", action="store_true",
                   help="search every launch again: ignore the journals of earlier runs of this plan or of its search")
    p.add_argument("--no-rebaseline", action="store_true", help="do not bench and write the baseline afterwards")
    p.add_argument("--seen", action="store_true",
                   help="tune the shapes training jobs called without a tuned config (the seen-keys file's 'seen' "
                        "suite; kernels: the whole SSD call's; implies --missing-only)")
    p.add_argument("--missing-only", action="store_true",
                   help="search only the launches whose shape key has no config of its own in the file, or one "
                        "that does not run here (extend coverage to new shapes without re-searching tuned keys)")
    p.add_argument("--json", action="store_true", help="also print the outcome as JSON")
    p.add_argument("--tuner", help=argparse.SUPPRESS)  # module:function or file.py:function (tests)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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

    cfg = common.guard_config(args)
    loaded = suites.load()  # names first: a typo is answered with the valid names, on any machine
    fp = fingerprint.collect()
    gpu_slug = args.gpu_slug or fingerprint.gpu_slug(fp)
    if args.seen:
        common.readable_seen_file(loaded, "--seen")
        args.shapes = [s.name for s in suites.seen_on(loaded, gpu_slug)]
        if not args.shapes:
            print(f"nothing seen to tune on {gpu_slug}: no call fell back since the last tune (the seen-keys file)")
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
    out = Path(args.out) if args.out else config_store.path_for(gpu_slug)
    fields = config_options(cfg)
    if args.margin is not None:
        fields["criteria"] = type(cfg.criteria)(**{**cfg.criteria.to_dict(), "margin": args.margin})
    flags = {"effort": args.effort, "seed": args.seed, "budget_seconds": args.budget_seconds,
             "total_budget_seconds": args.total_budget_seconds, "job_timeout_seconds": args.job_timeout}
    fields.update({k: v for k, v in flags.items() if v is not None})
    opts = AutotuneOptions(
        kernels=[e.name for e in entries if e.has_helion], shapes=shapes, out=out, state_dir=Path(args.state_dir),
        gpu_slug=gpu_slug, fingerprint=fp.to_dict(), fingerprint_digest=fp.digest(),
        devices=visible_devices(args.workers), tuner=tuner, fresh=args.fresh,
        missing_only=args.missing_only or args.seen,
        whole_suite=covers_whole_suite([e.name for e in entries], shapes), **fields)
    with rich_bar(sys.stderr.isatty()) as (on_start, on_job, log):
        progress = log or common.progress()
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
        if out.resolve() != config_store.path_for(gpu_slug).resolve():
            print("re-baseline skipped: --out is not the config store the kernels read")
        else:
            done = rebaseline(opts.kernels, shapes, Path(args.state_dir), progress)
            failed = f" (failed: {', '.join(done['failed'])})" if done["failed"] else ""
            print(f"baseline: {done['baseline']}{failed}")
    elif outcome.changed and not real:
        print("re-baseline skipped: a test tuner was used")
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=1, sort_keys=True))
    return common.EXIT_FAIL if s["failed"] or s["not_run"] else common.EXIT_OK
