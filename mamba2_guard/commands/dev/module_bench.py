"""``mamba2-guard dev module-bench``: the full mamba-ssm Mamba2 module, GEMMs included, on mamba-ssm's kernels and on
ours (``mamba2_guard.dev.module_bench.run``)."""

from __future__ import annotations

import argparse
from typing import Any

from mamba2_guard.commands import common
from mamba2_guard.core import flags

# the torch.compile modes worth timing a training step in
COMPILE_MODES = ("default", "reduce-overhead")

HELP = "the full mamba-ssm Mamba2 module, GEMMs included, on mamba-ssm's kernels and on ours"


def register(tools: Any) -> None:
    p = common.add_command(tools, "module-bench", HELP)
    p.add_argument("--shape", required=True, help="a shape of mamba2_kernels/suites.yaml")
    p.add_argument("--d-model", type=flags.integer(1), required=True, help="the model width (the suite has none)")
    p.add_argument("--rounds", type=flags.integer(1), default=30)
    p.add_argument("--seed", type=flags.integer(0), default=0)
    p.add_argument("--compiled", nargs="?", const="default", choices=COMPILE_MODES, metavar="MODE",
                   help="also time our training step in an eager loop, host included, eager against "
                        "torch.compile(fullgraph=True, dynamic=True, mode=MODE): "
                        f"{', '.join(COMPILE_MODES)} (the first if none is named)")
    p.add_argument("--steps", type=flags.integer(1), default=10,
                   help="with --compiled: steps back to back per wall sample (default 10)")
    p.add_argument("--out", type=common.output_file, required=True, help="JSON file to write")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import module_bench

    return module_bench.run(args, args.parser)
