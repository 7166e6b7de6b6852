"""``mamba2-guard dev measure-selection``: time every stored config at each grid shape's keys, and each state pass
fused and chained, for the selection rule's fit (``mamba2_guard.dev.measure_selection.measure``)."""

from __future__ import annotations

import argparse
from typing import Any

from mamba2_guard.commands import common
from mamba2_guard.core import flags

HELP = ("time every stored config at each grid shape's keys, and each state pass fused and chained, for the "
        "selection rule's fit")


def register(tools: Any) -> None:
    p = common.add_command(tools, "measure-selection", HELP)
    common.shape_arguments(p, "selection-grid", processes=True)
    p.add_argument("--out", type=common.output_file, required=True, help="measurements, JSON lines appended per kernel")
    p.add_argument("--rounds", type=flags.integer(1), default=10, help="timed samples per config (default 10)")
    p.add_argument("--seed", type=flags.integer(0), default=0)
    p.add_argument("--gpu-slug", type=flags.gpu_slug,
                   help="whose config file's configs are timed (default: this GPU's)")
    p.add_argument("--paths-only", action="store_true",
                   help="time only the whole call with each state pass fused and chained (the chain rule's "
                        "evidence), not every stored config")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import measure_selection

    return measure_selection.measure(args, args.parser)
