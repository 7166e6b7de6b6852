"""``mamba2-guard dev restamp``: record the current sources of re-validated kernels in a GPU's config file and
baseline (``mamba2_guard.dev.restamp.run``)."""

from __future__ import annotations

import argparse
from typing import Any

from mamba2_guard import PROJECT_ROOT
from mamba2_guard.adapters import files
from mamba2_guard.commands import common
from mamba2_guard.core import flags

HELP = "record the current sources of re-validated kernels in a GPU's config file and baseline"


def register(tools: Any) -> None:
    p = common.add_command(tools, "restamp", HELP)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--kernels", nargs="+", metavar="KERNEL", help="the kernels whose configs were re-validated")
    which.add_argument("--all", action="store_true", help="every source file (after re-validating every kernel)")
    p.add_argument("--gpu-slug", type=flags.gpu_slug,
                   required=True, help="whose config file and baseline, e.g. nvidia-h200")
    p.add_argument("--root", type=files.existing_directory, default=str(PROJECT_ROOT),
                   help="checkout holding mamba2_kernels/configs and baselines (default: this one)")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import restamp

    return restamp.run(args, args.parser)
