"""``mamba2-guard nightly``: one cycle, in the foreground."""

from __future__ import annotations

import argparse
from pathlib import Path

from mamba2_guard import EnvironmentProblem
from mamba2_guard.adapters import files
from mamba2_guard.commands import common


def register(commands) -> None:
    p = common.add_command(commands, "nightly",
                           "one nightly cycle: bench, check, drift, bring-up or re-tune and PR where due, reports")
    common.selection_arguments(p, "default")
    common.run_arguments(p)
    p.add_argument("--no-confirm", action="store_true", help="do not re-run flagged cases")
    p.add_argument("--strict", action="store_true", help="kernels not implemented yet fail the cycle")
    p.add_argument("--update-baseline", action="store_true", help="also write baselines/<gpu-slug>.yaml")
    p.add_argument("--out", metavar="DIR", type=files.writable_directory,
                   help="also copy report.md, report.json and result.json here")
    p.add_argument("--force-retune", action="store_true", help="re-tune even without drift")
    p.add_argument("--config", metavar="PATH", help="guard config (default: <state-dir>/guard.yaml if present)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """One cycle: fingerprint, bench, check with confirming re-runs, drift, reports, history."""
    from mamba2_guard.flows.nightly import CycleBusy, run_cycle

    state = Path(args.state_dir)
    print(f"state directory: {state}")
    try:
        outcome = run_cycle(state, common.cycle_options(args), progress=common.progress())
    except CycleBusy as exc:
        raise EnvironmentProblem(str(exc)) from exc
    from mamba2_guard.core import report

    common.console().print(report.rich_table(outcome.result, outcome.verdicts, None))
    for name, path in outcome.paths.items():
        print(f"{name}: {path}")
    return outcome.exit_code
