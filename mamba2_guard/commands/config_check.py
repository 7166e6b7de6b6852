"""``mamba2-guard config check``: validate a guard.yaml before the daemon reads it."""

from __future__ import annotations

import argparse
from pathlib import Path

from mamba2_guard.commands import common


def register(commands) -> None:
    p = common.add_command(commands, "config", "the guard's settings file (guard.yaml)")
    p.add_argument("action", choices=("check",), help="check: validate the file (exit 2 names the bad key)")
    p.add_argument("path", nargs="?", metavar="PATH", help="the file (default: <state-dir>/guard.yaml)")
    common.state_dir_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``config check [PATH]``: 0 when the file is valid (or absent, for the default path), 2 naming the key."""
    from mamba2_guard import config as guard_config

    path = Path(args.path) if args.path else Path(args.state_dir) / guard_config.FILE_NAME
    if args.path is None and not path.exists():
        print(f"{path}: no such file; the embedded defaults apply")
        return common.EXIT_OK
    guard_config.load(path)  # a GuardConfigError is a ValueError: main() prints it, exit 2
    print(f"{path}: ok")
    return common.EXIT_OK
