"""``mamba2-guard dev eager-step``: the SSD call in an eager loop, host included, ours and mamba-ssm's, beside the
device-time ratio (``mamba2_guard.dev.eager_step.run``)."""

from __future__ import annotations

import argparse
from typing import Any

from mamba2_guard.commands import common
from mamba2_guard.core import flags

HELP = "the SSD call in an eager loop, host included, ours and mamba-ssm's, beside the device-time ratio"


def register(tools: Any) -> None:
    p = common.add_command(tools, "eager-step", HELP)
    common.shape_arguments(p, "default")
    p.add_argument("--seqlens", nargs="+", type=flags.integer(1), metavar="N",
                   help="also each shape with these sequence lengths (e.g. 1024 2048 4096)")
    p.add_argument("--rounds", type=flags.integer(1), default=20, help="interleaved rounds (default 20)")
    p.add_argument("--steps", type=flags.integer(1), default=20, help="calls per wall sample (default 20)")
    p.add_argument("--compiled", action="store_true",
                   help="also time ours under torch.compile(fullgraph=True, dynamic=True), against eager")
    p.add_argument("--seed", type=flags.integer(0), default=0)
    p.add_argument("--out", type=common.output_file, required=True, help="JSON file to write")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import eager_step

    return eager_step.run(args, args.parser)
