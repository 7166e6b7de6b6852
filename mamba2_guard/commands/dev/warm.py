"""``mamba2-guard dev warm``: precompile the configs the runtime selects at a suite's shapes (a job's cold start)
(``mamba2_guard.dev.measure_selection.warm``)."""

from __future__ import annotations

import argparse
from typing import Any

from mamba2_guard.commands import common

HELP = "precompile the configs the runtime selects at a suite's shapes (a job's cold start)"


def register(tools: Any) -> None:
    p = common.add_command(tools, "warm", HELP)
    common.shape_arguments(p, "default", processes=True)
    p.add_argument("--entries", nargs="+", default=["ssd_combined_fwd_bwd", "ssd_combined_fwd"],
                   help="registry entries to run once (default: the whole SSD call)")
    p.add_argument("--baseline", action="store_true", help="also compile mamba-ssm's candidates")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import measure_selection

    return measure_selection.warm(args, args.parser)
