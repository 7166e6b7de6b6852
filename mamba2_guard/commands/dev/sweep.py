"""``mamba2-guard dev sweep``: hand-picked configs against the stored ones, timed on the GPU
(``mamba2_guard.dev.sweep.run``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mamba2_guard.commands import common
from mamba2_guard.core import flags

HELP = "hand-picked configs against the stored ones, timed on the GPU"


def register(tools: Any) -> None:
    p = common.add_command(tools, "sweep", HELP)
    p.add_argument("spec", type=Path, help="JSON list of jobs (see the module docstring)")
    p.add_argument("--out", type=common.output_file, required=True, help="results JSON, rewritten after each shape")
    p.add_argument("--rounds", type=flags.integer(1), default=30, help="timed samples per config (default 30)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: Triton's interpreter, no timing (default cuda)")
    p.add_argument("--no-precision", action="store_true", help="skip the outputs' comparison")
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.dev import sweep

    return sweep.run(args, args.parser)
