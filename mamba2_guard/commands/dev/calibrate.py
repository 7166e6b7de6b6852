"""``mamba2-guard dev calibrate``: measure the regression rule on a GPU: A/A false alarms, detection of an injected
slowdown (``mamba2_guard.dev.calibrate.run``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mamba2_guard.commands import common
from mamba2_guard.core import flags

HELP = "measure the regression rule on a GPU: A/A false alarms, detection of an injected slowdown"


def register(tools: Any) -> None:
    p = common.add_command(tools, "calibrate", HELP)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--suite", help="shape suite from mamba2_kernels/suites.yaml")
    where.add_argument("--shapes", nargs="+", help="shape names (default: nemotron3-nano)")
    p.add_argument("--kernels", nargs="+", help="registry entries (default: all with a Helion kernel)")
    p.add_argument("--runs", type=flags.integer(1), default=20)
    p.add_argument("--rounds", type=flags.integer(1), default=30)
    p.add_argument("--slowdown", type=flags.fraction, default=0.05, help="fraction in (0, 1); 0 skips those runs")
    p.add_argument("--aa-timing-only", action="store_true",
                   help="A/A runs re-time only; precision is the first bench's")
    p.add_argument("--seed", type=flags.integer(0), default=0)
    p.add_argument("--state-dir", type=common.output_directory, default=Path("/tmp/mamba2-guard-calibration"))
    p.add_argument("--json", type=common.output_file, required=True)
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import calibrate

    return calibrate.run(args, args.parser)
