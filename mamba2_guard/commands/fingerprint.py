"""``mamba2-guard fingerprint``: the environment a config or a baseline is recorded in."""

from __future__ import annotations

import argparse
import json

from mamba2_guard.commands import common


def register(commands) -> None:
    p = common.add_command(commands, "fingerprint", "print the environment fingerprint")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard.adapters import fingerprint

    fp = fingerprint.collect()
    data = fp.to_dict()
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return common.EXIT_OK
    from rich.table import Table

    table = Table(title=f"fingerprint {fp.digest()[:12]} ({fingerprint.gpu_slug(fp)})")
    table.add_column("field")
    table.add_column("value")
    for key, value in data.items():
        if key != "kernel_sources":
            table.add_row(key, "-" if value is None else str(value))
    common.console().print(table)
    return common.EXIT_OK
