"""The ``mamba2-guard`` command line: a dispatcher. Each command is a module of ``mamba2_guard.commands`` that
declares its flags (``register``) and runs (``run``); so does each ``dev`` tool (``mamba2_guard.commands.dev``).

Exit codes (``EPILOG``): 0 all good, 1 a regression or precision failure, 2 a usage or environment error.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from mamba2_guard import EnvironmentProblem, __version__
from mamba2_guard.adapters import files
from mamba2_guard.commands import (
    autotune,
    bench,
    bring_up,
    check,
    common,
    config_check,
    daemon,
    dev,
    doctor,
    drift,
    fingerprint,
    fit_selection,
    listing,
    metrics,
    nightly,
    pr,
)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = common.EXIT_OK, common.EXIT_FAIL, common.EXIT_USAGE
DESCRIPTION = """Benchmark, check and re-tune the Helion Mamba-2 kernels against mamba-ssm on this machine,
and propose new configs when the environment drifts."""
EPILOG = """exit codes:
  0  all good
  1  a regression, a precision failure or a kernel error (drift: drift found)
  2  a usage or environment error: a bad name or file, a missing dependency, a busy state directory

Each command has --help; the README lists them."""
# In the order `--help` lists them.
COMMANDS = (doctor, fingerprint, listing, bench, check, nightly, daemon, metrics, drift, autotune, bring_up,
            fit_selection, pr, config_check)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mamba2-guard", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(commands)
    dev.register(commands)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (subcommand parsers inherit the class): exit 2 naming the flag."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see --help)\n")


def _seen_file(text: str) -> str:
    """``$MAMBA2_GUARD_SEEN``: ``off``, or a file path (one there, or one that can be created)."""
    return text if text.strip().lower() == "off" else files.creatable_file(text, "the seen-keys file or off")


def _target(text: str) -> str:
    if text.count(":") != 1 or not all(text.split(":")):
        raise argparse.ArgumentTypeError(f"expected module:function or file.py:function, got {text!r}")
    return text


def _forced_paths(value: str) -> None:
    from mamba2_kernels.ssd import forcing

    try:
        forcing.parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_environment() -> None:
    """The guard's environment variables, checked before anything runs (exit 2 naming the variable)."""
    from mamba2_guard.bench.worker import BENCH_ENV
    from mamba2_guard.flows.autotune import TUNER_ENV
    from mamba2_kernels.seen import SEEN_ENV
    from mamba2_kernels.ssd import forcing

    checks = {"MAMBA2_GUARD_STATE": files.creatable_directory, SEEN_ENV: _seen_file,
              "MAMBA2_GUARD_PUSHGATEWAY": common.url, TUNER_ENV: _target, BENCH_ENV: _target,
              forcing.PATHS_ENV: _forced_paths}
    for name, valid in checks.items():
        value = os.environ.get(name)
        if value is None:
            continue
        try:
            if not value.strip():
                raise argparse.ArgumentTypeError("is set but empty")
            valid(value)
        except argparse.ArgumentTypeError as exc:
            raise EnvironmentProblem(f"${name}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0, 1 (a regression or precision failure) or 2 (usage or environment, one line naming the file
    or flag). ``docs/failure-model.md`` lists what each code means."""
    from mamba2_guard.adapters.history import HistoryError
    from mamba2_kernels import seen

    seen.stop_recording()
    try:
        _check_environment()
        parser = build_parser()
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        return args.func(args)
    except (EnvironmentProblem, HistoryError) as exc:
        return _usage_error(exc)
    except OSError as exc:  # disk full, read-only, a path under a file, a host that does not answer
        return _usage_error(common.os_error(exc))
    except (KeyError, ValueError) as exc:
        return _usage_error(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)


def _usage_error(message: object) -> int:
    """Print ``message`` on one line (a YAML parser's, for one, spans several with a caret) and return 2."""
    print(f"mamba2-guard: {' '.join(str(message).split())}", file=sys.stderr)
    return EXIT_USAGE

