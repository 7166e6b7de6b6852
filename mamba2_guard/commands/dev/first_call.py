"""``mamba2-guard dev first-call``: seconds of the first call at each shape in a fresh process, ours and mamba-ssm's
(``mamba2_guard.dev.measure_selection.first_call``)."""

from __future__ import annotations

import argparse
from typing import Any

from mamba2_guard.commands import common

HELP = "seconds of the first call at each shape in a fresh process, ours and mamba-ssm's"


def register(tools: Any) -> None:
    p = common.add_command(tools, "first-call", HELP)
    common.shape_arguments(p, "zoo-steered")  # one process at a time: compiles would compete
    p.add_argument("--entries", nargs="+", default=["ssd_combined_fwd_bwd"],
                   help="registry entries whose first call is timed (default: the SSD forward + backward)")
    p.add_argument("--sides", nargs="+", choices=["helion", "mamba_ssm"], default=["helion", "mamba_ssm"],
                   help="ours, mamba-ssm's, or both (default), each in its own fresh process")
    p.add_argument("--empty-caches", action="store_true",
                   help="give each process new, empty Triton, Helion and Inductor caches (removed after), "
                        "as on a machine that never ran the shape (default: the environment's caches)")
    p.add_argument("--record", action="store_true",
                   help="keep each shape's seconds in baselines/first-call/<gpu-slug>.yaml (the results "
                        "page shows them), as each shape finishes")
    p.add_argument("--missing-only", action="store_true",
                   help="with --record: skip the shapes that file already holds for these entries and caches "
                        "(rerun a command cut short to measure the rest)")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import measure_selection

    return measure_selection.first_call(args, args.parser)
