"""``mamba2-guard metrics``: export the last cycle's metrics as a textfile, to a Pushgateway, or show them."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mamba2_guard import EnvironmentProblem
from mamba2_guard.commands import common


def register(commands) -> None:
    p = common.add_command(commands, "metrics", "export the last cycle's metrics: textfile | push | show")
    p.add_argument("action", choices=("textfile", "push", "show"),
                   help="textfile: write the node-exporter file; push: send to a Pushgateway; show: print")
    common.state_dir_argument(p)
    p.add_argument("--snapshot", help="a latest.json to read (default: <state-dir>/latest.json)")
    p.add_argument("--path", help="textfile path (default: <state-dir>/metrics/mamba2_guard.prom)")
    p.add_argument("--gateway", help="Pushgateway URL (default: $MAMBA2_GUARD_PUSHGATEWAY)")
    p.add_argument("--job", default="mamba2-guard", help="Pushgateway job name (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 on success, 2 when there is nothing to export or no gateway is given."""
    from mamba2_guard.adapters.metrics import GuardMetrics
    from mamba2_guard.adapters.state import StateDir, load_daemon_state

    state = StateDir(Path(args.state_dir))
    m = GuardMetrics()
    source = Path(args.snapshot) if args.snapshot else state.latest
    problem = m.read_snapshot(source)
    if problem:
        print(f"mamba2-guard: {'--snapshot: ' if args.snapshot else ''}no usable snapshot at {source}: {problem} "
              "(run a cycle first)", file=sys.stderr)
        return 2
    if state.daemon_state.exists():
        m.restore(load_daemon_state(state)[0])
    if args.action == "show":
        sys.stdout.write(m.exposition().decode())
    elif args.action == "textfile":
        path = Path(args.path) if args.path else state.textfile
        m.write_textfile(path)
        print(f"metrics: wrote {path}")
    else:
        url = args.gateway or os.environ.get("MAMBA2_GUARD_PUSHGATEWAY")
        if not url:
            print("mamba2-guard: no Pushgateway (--gateway or MAMBA2_GUARD_PUSHGATEWAY)", file=sys.stderr)
            return 2
        try:
            m.push(url, args.job)
        except OSError as exc:
            raise EnvironmentProblem(f"Pushgateway {url}: {common.os_error(exc)}") from None
        print(f"metrics: pushed to {url} (job {args.job})")
    return 0
