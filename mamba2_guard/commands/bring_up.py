"""``mamba2-guard bring-up``: a new GPU's bring-up in the foreground, the same flow the nightly runs by itself
(``mamba2_guard.flows.bringup``), with a progress bar and an estimate of the time left."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from mamba2_guard import EnvironmentProblem
from mamba2_guard.adapters import files
from mamba2_guard.commands import common
from mamba2_guard.core import bringup, flags


def register(commands: Any) -> None:
    p = common.add_command(commands, "bring-up", "bring a new GPU model up: borrowed configs validated here, then "
                           "searches ordered by value, then the fit")
    p.add_argument("--budget-minutes", type=flags.minutes(), default=30.0, metavar="N",
                   help="device time for this run (default 30); what is left resumes on the next run")
    p.add_argument("--job-seconds", type=flags.seconds(), metavar="S",
                   help="Helion's search per job (default: autotune.bringup_job_seconds of the guard config, 120)")
    p.add_argument("--until", choices=bringup.STAGES, metavar="STAGE",
                   help=f"stop after this stage ({', '.join(bringup.STAGES)}; default: run them all)")
    p.add_argument("--withhold-configs", action="store_true",
                   help="run as if this GPU were new: as <slug>-withheld, with no other GPU's file serving or "
                        "seeding it (measures the bring-up on a GPU that has configs)")
    p.add_argument("--speedups", nargs="+", metavar="RESULT",
                   help="bench results (`bench --json`) of the whole call on this GPU: the searches start with "
                        "the shapes measured below mamba-ssm's speed, the slowest first (the nightly passes its "
                        "own bench's; a later file overrides an earlier one at the same shape)")
    p.add_argument("--force", action="store_true", help="run the stages left even where no bring-up is due")
    p.add_argument("--out", metavar="PATH", type=files.creatable_file,
                   help="config file (default: mamba2_kernels/configs/<gpu-slug>.yaml)")
    p.add_argument("--pr", action="store_true", help="open or update the GPU's config PR after each stage that "
                   "stored configs, as the nightly does")
    common.state_dir_argument(p)
    p.add_argument("--config", metavar="PATH", help="guard config (default: <state-dir>/guard.yaml if present)")
    p.add_argument("--json", action="store_true", help="also print the outcome as JSON")
    p.add_argument("--tuner", help=argparse.SUPPRESS)  # module:function or file.py:function (tests)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.bench.shard import visible_devices
    from mamba2_guard.flows import autotune
    from mamba2_guard.flows import bringup as flow
    from mamba2_kernels import config_store

    cfg = common.guard_config(args)
    call_speedups = measured_speedups(args.speedups or ())
    if args.withhold_configs:
        flow.withhold_configs()
    fp = fingerprint.collect()
    gpu_slug = fingerprint.gpu_slug(fp)
    tuner = args.tuner or os.environ.get(autotune.TUNER_ENV) or autotune.DEFAULT_TUNER
    if tuner == autotune.DEFAULT_TUNER and not torch.cuda.is_available():
        raise EnvironmentProblem("bring-up needs a CUDA GPU and none is visible; run it on the new GPU's runner")
    state_dir = Path(args.state_dir)
    out = Path(args.out) if args.out else config_store.path_for(gpu_slug)
    if not args.force and not flow.is_due(state_dir, gpu_slug, out):
        print(f"nothing to bring up on {gpu_slug}: its config file holds every kernel and no bring-up is in progress "
              "(--force runs the stages left)")
        return common.EXIT_OK
    stages = flow.stages_for(gpu_slug, flow.tuned_before(state_dir, gpu_slug, out))  # once: the bar's total, the run
    opts = flow.options_from_config(
        cfg, job_budget_seconds=args.job_seconds, state_dir=state_dir, gpu_slug=gpu_slug,
        budget_seconds=args.budget_minutes * 60, fingerprint=fp.to_dict(), fingerprint_digest=fp.digest(), out=out,
        devices=visible_devices(), tuner=tuner, until=args.until, stages=stages,
        call_speedups=call_speedups)
    on_configs = _proposer(state_dir, cfg, fp, gpu_slug) if args.pr else None
    state = flow.load_state(state_dir, gpu_slug)
    total = sum(stage.jobs for stage in stages)
    with _bar(total, bringup.progress(state)["jobs_done"] if state else 0, sys.stderr.isatty()) as (on_job, log):
        outcome = flow.run_bring_up(opts, log, on_configs=on_configs, on_job=on_job)
    summary = bringup.progress(outcome.state)
    print(bringup.render(summary))
    print(f"state: {flow.state_path(state_dir, gpu_slug)}; configs: {opts.config_path}")
    if outcome.stopped:
        print(f"stopped: {outcome.stopped}")
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=1, sort_keys=True, default=str))
    failed = sum(int((r.get("summary") or {}).get("failed") or 0) for r in outcome.runs)
    return common.EXIT_FAIL if failed else common.EXIT_OK


def measured_speedups(paths: Sequence[str]) -> dict[str, float]:
    """``--speedups``: the whole call's speedup per shape in these bench results; at a shape two of them
    measured, the later file's."""
    from mamba2_guard.flows import baselines
    from mamba2_guard.flows import bringup as flow

    speedups: dict[str, float] = {}
    for path in paths:
        try:
            measured = flow.call_speedups(baselines.read_result(Path(path)).cases)
        except ValueError as exc:
            raise ValueError(f"--speedups: {exc}") from None
        if not measured:
            raise ValueError(f"--speedups: {path}: expected a bench of the whole call ({flow.WHOLE_CALL}) "
                             "against mamba-ssm; it has no such case")
        speedups.update(measured)
    return speedups


def _proposer(state_dir: Path, cfg: Any, fp: Any, gpu_slug: str) -> Callable[[dict[str, Any]], None]:
    """The PR step after each stage that stored configs: the GPU's one PR, opened or updated."""
    from mamba2_guard.flows import pr as prflow

    def propose(summary: dict[str, Any]) -> None:
        outcome = prflow.run_pr(state_dir, cfg, fp.to_dict(), gpu_slug, bring_up=summary,
                                reproduce_command="mamba2-guard bring-up")
        for message in outcome.messages:
            print(f"PR: {message}")

    return propose


@contextlib.contextmanager
def _bar(total: int, done: int, enabled: bool) -> Iterator[tuple[Any, Callable[[str], None]]]:
    """(on_job, log): on a terminal, a rich bar of the jobs of every stage with the time left (log prints
    above it); plain lines otherwise."""
    from mamba2_guard.bench.run import plain_progress

    if not enabled:
        yield None, plain_progress
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("bring-up"), BarColumn(), MofNCompleteColumn(), TextColumn("left"),
                   TimeRemainingColumn(), TextColumn("{task.description}"), console=Console(stderr=True))
    task = bar.add_task("", total=total, completed=done)

    def on_job(entry: dict[str, Any]) -> None:
        bar.update(task, advance=1, description=f"{entry['job']} {entry['status']}")

    with bar:
        yield on_job, bar.console.print
