"""``mamba2-guard check``: verdicts for a saved bench result against the baseline and the history."""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

from mamba2_guard.commands import common


def register(commands) -> None:
    p = common.add_command(commands, "check", "verdicts for a bench result against baseline and history")
    p.add_argument("--result", metavar="PATH", help="a bench result JSON (default: the latest in the state dir)")
    p.add_argument("--baseline", metavar="PATH", help="default: baselines/<gpu-slug>.yaml")
    common.state_dir_argument(p)
    p.add_argument("--strict", action="store_true", help="kernels not implemented yet fail the check")
    p.add_argument("--config", metavar="PATH", help="guard config whose policy judges (default: "
                   "<state-dir>/guard.yaml if present)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Verdicts for a saved bench result against the baseline and the history."""
    from mamba2_guard.adapters.history import History
    from mamba2_guard.core import report
    from mamba2_guard.core.verdicts import exit_code
    from mamba2_guard.flows import baselines
    from mamba2_guard.flows.check import earlier_speedups, history_windows, run_check

    policy = common.guard_config(args).verdict_policy  # as the nightly judges; a bad file stops here, before reading
    state = Path(args.state_dir)
    baseline_path = common.existing_file("--baseline", args.baseline) if args.baseline else None
    if args.result:
        result_path = common.existing_file("--result", args.result)
    else:
        result_path = common.newest_result(state)
        if result_path is None:
            raise ValueError(f"--result: no saved bench result under {state / common.RESULTS_DIR}; run "
                             "`mamba2-guard bench` or `mamba2-guard nightly`")
    try:
        result = baselines.read_result(result_path)
    except ValueError as exc:
        raise ValueError(f"--result: {exc}") from None
    baseline_path = baseline_path or baselines.path_for_result(result)
    baseline = baselines.load(baseline_path)
    if baseline is None and args.baseline:  # named, yet empty: "no baseline" would judge nothing
        raise ValueError(f"--baseline: {baseline_path}: empty; expected a baseline (fingerprint, results)")
    with History(state / "history.sqlite") as history:
        earlier = history.run_of(result)
        windows = history_windows(result, history, policy, before_run=earlier)
        result, verdicts = run_check(result, baseline, windows, policy)
        speedups = earlier_speedups(result, windows)
        code = exit_code(verdicts, missing_fails=args.strict)
        if earlier is None:
            history.record(result, verdicts, datetime.datetime.now(datetime.timezone.utc), job="check",
                           status="pass" if code == 0 else "fail")
    from mamba2_guard.flows.nightly import write_reports  # imports torch: only once the inputs were read

    paths = write_reports(state, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), result, verdicts, baseline, policy,
                          save_result=False, earlier=speedups)  # a result checked again is not saved again
    common.console().print(report.rich_table(result, verdicts, baseline))
    print(f"report: {paths['report_md']}")
    print(f"judged: {result_path}" + ("" if args.result else f" (the newest result of {state})"))
    if earlier is not None:
        print(f"history: the result is run {earlier} already; judged against the runs before it, not recorded again")
    if isinstance(partial := result.extra.get("partial"), dict):
        print(f"note: {result_path} holds {partial.get('cases')} of the {partial.get('planned')} planned cases: "
              f"its bench stopped early; the same command with --resume --json {result_path} measures the rest")
    return code
