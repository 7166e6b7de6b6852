"""``mamba2-guard dev selected``: the config each launch of a whole call selects from a GPU's config file, no GPU
needed; with --against, the launches a config change moves (``mamba2_guard.dev.selected_configs.run``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from mamba2_guard.commands import common
from mamba2_guard.core import flags

HELP = ("the config each launch of a whole call selects from a GPU's config file, no GPU needed; with --against, "
        "the launches a config change moves")


def register(tools: Any) -> None:
    p = common.add_command(tools, "selected", HELP)
    common.shape_arguments(p, "zoo-steered")
    p.add_argument("--entries", nargs="+", default=["ssd_combined_fwd_bwd", "mamba2_layer_fwd_bwd"],
                   help="whole calls' registry entries (default: the SSD call's and the layer's forward + "
                        "backward)")
    p.add_argument("--gpu-slug", type=flags.gpu_slug,
                   default="nvidia-h200", help="whose config file (default nvidia-h200)")
    p.add_argument("--against", type=Path, help="another config file: name the launches that select "
                   "another config from it (e.g. the file before a re-tune)")
    p.add_argument("--seqlen", type=flags.integer(1),
                   help="the CPU run's sequence length (default: two chunks); keys take the shape's own tokens")
    p.add_argument("--processes", type=flags.integer(1), default=os.cpu_count() or 1,
                   help="parallel processes, one (shape, call) each (default: the CPU count)")
    p.add_argument("--out", type=common.output_file, help="also write the selections as JSON")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import selected_configs

    return selected_configs.run(args, args.parser)
