"""``mamba2-guard dev record-results``: write bench results made elsewhere into this checkout's baselines
(``mamba2_guard.dev.record_results.run``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mamba2_guard import PROJECT_ROOT
from mamba2_guard.adapters import files
from mamba2_guard.commands import common

HELP = "write bench results made elsewhere into this checkout's baselines"


def register(tools: Any) -> None:
    p = common.add_command(tools, "record-results", HELP)
    p.add_argument("results", nargs="+", type=Path, metavar="RESULT", help="bench result JSON files")
    p.add_argument("--root", type=files.existing_directory, default=str(PROJECT_ROOT),
                   help="checkout holding baselines/ (default: this one)")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import record_results

    return record_results.run(args, args.parser)
