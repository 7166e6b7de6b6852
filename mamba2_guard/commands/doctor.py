"""``mamba2-guard doctor``: the installed versions and files, checked fast."""

from __future__ import annotations

import argparse
import sys

from mamba2_guard import __version__
from mamba2_guard.commands import common


def register(commands) -> None:
    p = common.add_command(commands, "doctor", "check the installation quickly: versions and files, nothing compiled")
    p.add_argument("--quiet", action="store_true", help="print only problems")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Installed versions and files only, nothing imported or compiled: fast. ``fingerprint`` has the rest."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    problems, versions = [], {}
    for dist in ("torch", "triton", "helion", "mamba-ssm", "einops"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            problems.append(f"{dist} is not installed (scripts/install.sh installs it)")
    if "mamba-ssm" in versions and not versions["mamba-ssm"].startswith("2.3."):
        problems.append(f"mamba-ssm {versions['mamba-ssm']} is installed; the guard compares with 2.3.x")
    spec = importlib.util.find_spec("mamba_ssm")
    locations = list(spec.submodule_search_locations or ()) if spec else []
    if "mamba-ssm" in versions and not any((Path(d) / "ops/triton/ssd_combined.py").is_file() for d in locations):
        problems.append("mamba-ssm has no ops/triton/ssd_combined.py (a broken install)")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if not args.quiet:
        print(f"mamba2-guard {__version__}: " + ", ".join(f"{d} {v}" for d, v in versions.items()))
        if not problems:
            print("mamba2-guard: environment ok (`mamba2-guard fingerprint` shows the whole environment)")
    return common.EXIT_USAGE if problems else common.EXIT_OK
