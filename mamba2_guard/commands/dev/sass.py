"""``mamba2-guard dev sass``: SASS of an entry's kernels, compiled offline with the stored configs
(``mamba2_guard.dev.sass.run``)."""

from __future__ import annotations

import argparse
from typing import Any

from mamba2_guard.commands import common
from mamba2_guard.core import flags

HELP = "SASS of an entry's kernels, compiled offline with the stored configs"


def register(tools: Any) -> None:
    p = common.add_command(tools, "sass", HELP)
    p.add_argument("entries", nargs="+", metavar="ENTRY", help="registry entry names")
    p.add_argument("--shape", default="nemotron3-nano", help="suite shape (default nemotron3-nano)")
    p.add_argument("--seqlen", type=flags.integer(1), default=512,
                   help="shorter sequence for the CPU capture (default 512); the configs are looked up "
                        "by key, so a shorter one finds the shape's own through the nearest-key rule")
    p.add_argument("--gpu-slug", type=flags.gpu_slug,
                   default="nvidia-h200", help="whose configs (default nvidia-h200)")
    p.add_argument("--arch", type=flags.integer(1), default=90, help="compute capability x 10 (default 90: sm_90)")
    p.add_argument("--out", type=common.output_directory,
                   help="also write each kernel's Triton code, PTX and SASS here")
    p.add_argument("--json", type=common.output_file, help="write the reports as JSON")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import sass

    return sass.run(args, args.parser)
