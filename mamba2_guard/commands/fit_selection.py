"""``mamba2-guard fit-selection``: fit the config-selection rule to ``dev measure-selection``'s measurements and
write it, with the grid's best configs and the state passes' chain rules, into a GPU's config file (no GPU)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mamba2_guard import EnvironmentProblem
from mamba2_guard.commands import common
from mamba2_guard.core import flags


def register(commands) -> None:
    p = common.add_command(commands, "fit-selection", "fit the config-selection rule to `dev measure-selection`'s "
                           "file and write it into the config file (no GPU; docs/config-selection.md)")
    p.add_argument("measurements", metavar="MEASUREMENTS", help="the JSON lines `dev measure-selection` wrote")
    p.add_argument("--gpu-slug", metavar="SLUG", type=flags.gpu_slug,
                   help="whose config file (default: this GPU's; needed on a machine without that GPU)")
    p.add_argument("--out", metavar="PATH", help="config file (default: mamba2_kernels/configs/<gpu-slug>.yaml)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.flows import selection_measure
    from mamba2_kernels import config_store

    # The fingerprint (torch's view of the GPU) only when the file is this GPU's: a bad input answers at once.
    path = Path(args.out) if args.out else config_store.path_for(args.gpu_slug
                                                                 or fingerprint.gpu_slug(fingerprint.collect()))
    try:
        fits = selection_measure.fit_into(path, Path(args.measurements))
    except ValueError as exc:
        raise EnvironmentProblem(str(exc)) from exc
    for fit in fits:
        print(fit.describe())
    print(f"wrote {path}")
    return common.EXIT_OK
