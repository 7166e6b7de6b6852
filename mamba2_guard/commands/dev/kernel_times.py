"""``mamba2-guard dev kernel-times``: a whole call's device time kernel by kernel at each shape, ours and mamba-ssm's
(``mamba2_guard.dev.kernel_times.run``)."""

from __future__ import annotations

import argparse
from typing import Any

from mamba2_guard.commands import common
from mamba2_guard.core import flags

HELP = "a whole call's device time kernel by kernel at each shape, ours and mamba-ssm's"


def register(tools: Any) -> None:
    p = common.add_command(tools, "kernel-times", HELP)
    common.shape_arguments(p, "zoo-steered")
    p.add_argument("--entry", default="ssd_combined_fwd_bwd", help="a whole call's registry entry "
                   "(default ssd_combined_fwd_bwd)")
    p.add_argument("--calls", type=flags.integer(1), default=10, help="profiled calls (default 10)")
    p.add_argument("--seed", type=flags.integer(0), default=0)
    p.add_argument("--out", type=common.output_file, help="also write the rows as JSON")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import kernel_times

    return kernel_times.run(args, args.parser)
