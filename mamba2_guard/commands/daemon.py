"""``mamba2-guard daemon``: the scheduled nightly, the drift watch and ``/metrics``; the nightly settings it
passes on (``-o``) are checked at start."""

from __future__ import annotations

import argparse
from typing import Any

from mamba2_guard.adapters import files
from mamba2_guard.commands import common
from mamba2_guard.core import flags

# The nightly's settings that `daemon -o KEY=VALUE` passes on (mamba2_guard.flows.nightly.CycleOptions).
NIGHTLY_OPTIONS = ("suite", "shapes", "kernels", "seed", "rounds", "confirm", "strict", "update_baseline", "out_dir",
                   "force_retune", "cuda_graphs", "config", "pr", "workers", "case_timeout_s")


def register(commands) -> None:
    from mamba2_guard import DEFAULT_METRICS_PORT, DEFAULT_NIGHTLY_CRON, DRIFT_TARGET, NIGHTLY_TARGET

    parser = common.add_command(commands, "daemon", "scheduled nightly, drift watch and /metrics (APScheduler)")
    common.state_dir_argument(parser)
    parser.add_argument("--nightly-cron", type=crontab, default=DEFAULT_NIGHTLY_CRON,
                        help="crontab, UTC (default: %(default)s)")
    parser.add_argument("--nightly-interval", type=flags.seconds(), metavar="S",
                        help="run the nightly every S seconds instead")
    parser.add_argument("--nightly-timeout", type=flags.seconds(), default=6 * 3600, metavar="S",
                        help="hard timeout of one cycle (default: %(default)s)")
    parser.add_argument("--nightly-target", default=NIGHTLY_TARGET, help=argparse.SUPPRESS)
    parser.add_argument("--option", "-o", action="append", type=option, default=[], metavar="KEY=VALUE",
                        help="a nightly setting (YAML value), repeatable, e.g. -o suite=default -o rounds=50; "
                             f"keys: {', '.join(NIGHTLY_OPTIONS)}")
    parser.add_argument("--drift-interval", type=flags.seconds(), default=900, metavar="S", help="default: %(default)s")
    parser.add_argument("--drift-timeout", type=flags.seconds(), default=300, metavar="S", help="default: %(default)s")
    parser.add_argument("--drift-target", default=DRIFT_TARGET, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-interval", type=flags.seconds(), default=60, metavar="S", help=argparse.SUPPRESS)
    parser.add_argument("--metrics-port", type=flags.integer(0, 65535), default=DEFAULT_METRICS_PORT,
                        help="/metrics port, 0 = none (default: %(default)s)")
    parser.add_argument("--metrics-addr", default="127.0.0.1",
                        help="bind address (default: %(default)s; 0.0.0.0 for a remote Prometheus)")
    parser.add_argument("--misfire-grace", type=flags.seconds(), default=6 * 3600, metavar="S",
                        help="default: %(default)s")
    parser.add_argument("--shutdown-grace", type=flags.seconds(zero=True), default=120, metavar="S",
                        help="on SIGTERM, wait this long for a running job before killing it (default: %(default)s)")
    parser.add_argument("--kill-grace", type=flags.seconds(zero=True), default=10, metavar="S",
                        help="between SIGTERM and SIGKILL of a child (default: %(default)s)")
    parser.add_argument("--no-catch-up", action="store_true", help="do not run a missed nightly at start")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mamba2_guard import daemon

    common.guard_config(args)  # refused at start, not by every cycle after (exit 2 names the key)
    if args.nightly_target == daemon.NIGHTLY_TARGET:  # a test target takes its own options
        unknown = sorted({key for key, _ in args.option} - set(NIGHTLY_OPTIONS))
        if unknown:
            raise ValueError(f"-o: unknown option(s) {', '.join(unknown)}; valid: {', '.join(NIGHTLY_OPTIONS)}")
        for key, value in args.option:
            check_nightly_option(key, value)
    return daemon.cmd_daemon(args)


def check_nightly_option(key: str, value: Any) -> None:
    """A ``daemon -o`` value as the nightly's own flag would take it, at start: otherwise every scheduled
    cycle would fail on it, night after night."""
    from mamba2_guard import config as guard_config

    numbers = {"rounds": flags.integer(1), "seed": flags.integer(0), "case_timeout_s": flags.seconds(),
               "workers": common.workers_arg}
    try:
        if key in numbers:
            numbers[key](str(value))
        elif key in ("confirm", "strict", "update_baseline", "force_retune", "cuda_graphs", "pr"):
            if not isinstance(value, bool):
                raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")
        elif key in ("shapes", "kernels"):
            if not (isinstance(value, list) and all(isinstance(name, str) for name in value)):
                raise argparse.ArgumentTypeError(f"expected a list of names such as [a, b], got {value!r}")
            if key == "kernels":
                from mamba2_kernels import registry  # imports torch: only where a name is to be looked up

                registry.select(value)
            else:
                from mamba2_kernels import suites

                loaded = suites.load()
                for name in value:
                    loaded.shape(name)
        elif key == "suite":
            from mamba2_kernels import suites

            suites.load().suite(str(value))
        elif key in ("out_dir", "config") and value is not None:  # null: none
            if not isinstance(value, str):
                raise argparse.ArgumentTypeError(f"expected a path, got {value!r}")
            if key == "config":
                guard_config.load(value)
            else:
                files.creatable_directory(value)
    except (argparse.ArgumentTypeError, KeyError, ValueError) as exc:
        raise ValueError(f"-o {key}: {exc.args[0] if exc.args else exc}") from None


def option(text: str) -> tuple[str, Any]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.replace("-", "_"), yaml.safe_load(value)


def crontab(text: str) -> str:
    """A crontab line APScheduler takes (five fields, UTC), checked before the daemon starts."""
    from apscheduler.triggers.cron import CronTrigger

    try:
        CronTrigger.from_crontab(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a crontab line (minute hour day month weekday), got {text!r}: "
                                         f"{exc}") from None
    return text
