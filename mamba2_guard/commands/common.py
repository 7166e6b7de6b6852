"""What the commands share: exit codes, the console and progress lines, the flags several commands take, and
the checks that turn a bad name or file into one line naming the flag (exit 2)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from mamba2_guard import EnvironmentProblem
from mamba2_guard.adapters import files
from mamba2_guard.adapters.state import default_state_dir
from mamba2_guard.core import flags

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
# Where bench and nightly save results and where check finds the latest: <state>/reports/<stamp>-result.json;
# a bench written elsewhere (--json) leaves its path in <state>/reports/last-bench.txt.
RESULTS_DIR, RESULT_SUFFIX, LAST_BENCH = "reports", "-result.json", "last-bench.txt"


def newest_result(state: Path) -> Path | None:
    """The newest result of a bench or a nightly of this state directory, by modification time."""
    saved = list((state / RESULTS_DIR).glob(f"*{RESULT_SUFFIX}"))
    pointer = state / RESULTS_DIR / LAST_BENCH
    if pointer.is_file():
        named = Path(pointer.read_text().strip())
        if named.is_file():
            saved.append(named)
    return max(saved, key=lambda path: path.stat().st_mtime, default=None)


def add_command(commands: Any, name: str, text: str) -> argparse.ArgumentParser:
    """A subcommand whose help line is also its description (``COMMAND --help`` opens with it)."""
    return commands.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")


def console():
    from rich.console import Console

    # A terminal or $COLUMNS sets the width (rich reads both); a log without either gets wide tables.
    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(highlight=False, width=160 if wide else None)


def progress():
    """A rich progress line on a terminal, plain lines in CI logs."""
    from mamba2_guard.bench.run import plain_progress

    if not sys.stderr.isatty():
        return plain_progress
    from rich.console import Console

    rich_console = Console(stderr=True, highlight=False)
    return lambda message: rich_console.print(message)


def use_cpu_interpret() -> bool:
    import torch

    return not torch.cuda.is_available()


def state_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=files.creatable_directory, default=str(default_state_dir()),
                        help="default: %(default)s")


def output_file(text: str) -> Path:
    """A file a command writes: one there, or one that can be created (exit 2 naming the flag otherwise)."""
    return Path(files.creatable_file(text))


def output_directory(text: str) -> Path:
    """A folder a command writes into: one there, or one that can be created."""
    return Path(files.creatable_directory(text))


def shape_arguments(parser: argparse.ArgumentParser, suite: str, processes: bool = False) -> None:
    """The shapes a command runs at: a suite (default ``suite``) or shape names, never both; with ``processes``,
    its parallel compile processes (the dev tools that compile every shape first)."""
    which = parser.add_mutually_exclusive_group()  # both given: one would be dropped without a word
    which.add_argument("--suite", default=suite, metavar="NAME",
                       help=f"shape suite from mamba2_kernels/suites.yaml (default: the suite '{suite}')")
    which.add_argument("--shapes", nargs="+", metavar="SHAPE", help="shape names instead of a suite")
    if processes:
        parser.add_argument("--processes", type=flags.integer(1), default=8,
                            help="parallel compile processes (default 8)")


def selection_arguments(parser: argparse.ArgumentParser, suite: str) -> None:
    """``shape_arguments`` and the kernels (bench, nightly, list, autotune)."""
    shape_arguments(parser, suite)
    parser.add_argument("--kernels", nargs="+", metavar="KERNEL", help="kernel names (default: all)")


def run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a bench run (bench, nightly)."""
    parser.add_argument("--seed", type=flags.integer(0), default=0,
                        help="input seed, recorded in the result (default: %(default)s)")
    parser.add_argument("--rounds", type=flags.integer(1), default=30,
                        help="timed samples per implementation (default: %(default)s)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="time every entry as CUDA-graph replays (L2 still flushed before each): device work "
                             "without host overhead; whole calls and the layer are always timed so")
    state_dir_argument(parser)
    parser.add_argument("--workers", type=workers_arg, default=1, metavar="N|auto",
                        help="bench workers, one per GPU (child processes; auto: all visible GPUs; default 1)")
    parser.add_argument("--case-timeout", type=flags.seconds(), default=1800.0, metavar="S",
                        help="with --workers: kill a worker that finishes no case for S seconds (default 1800)")
    parser.add_argument("--bench-fn", help=argparse.SUPPRESS)  # module:function or file.py:function (tests)


def guard_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the commands that act on one GPU's files with the guard's settings."""
    state_dir_argument(parser)
    parser.add_argument("--config", metavar="PATH", help="guard config (default: <state-dir>/guard.yaml if present)")
    parser.add_argument("--gpu-slug", metavar="SLUG", type=flags.gpu_slug,
                        help="config/baseline file name (default: this GPU's)")


def workers_arg(value: str):
    from mamba2_guard.bench.shard import parse_workers

    try:
        return parse_workers(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("workers: ")) from None


def url(text: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected an http(s)://host URL, got {text!r}")
    return text


def guard_config(args: argparse.Namespace):
    from mamba2_guard import config as guard_config

    try:
        return guard_config.load(getattr(args, "config", None), getattr(args, "state_dir", None))
    except guard_config.GuardConfigError as exc:
        raise EnvironmentProblem(str(exc)) from None


def selected(args: argparse.Namespace):
    from mamba2_kernels import registry, suites

    loaded = suites.load()
    if not args.shapes and args.suite == suites.SEEN_SUITE:
        readable_seen_file(loaded, "--suite seen")
    shapes = [loaded.shape(s) for s in args.shapes] if args.shapes else loaded.suite(args.suite)
    return registry.select(args.kernels or None), shapes


def readable_seen_file(loaded, flag: str) -> None:
    """A torn seen-keys file is named (exit 2), not taken for "no call fell back": what was seen is unknown."""
    if loaded.seen_problem:
        raise ValueError(f"{flag}: {loaded.seen_problem}")


def cycle_options(args: argparse.Namespace, **overrides):
    from mamba2_guard.flows.nightly import CycleOptions

    selected(args)  # unknown names: exit 2 with the valid ones before anything runs
    return CycleOptions(suite=args.suite, shapes=args.shapes or (), kernels=args.kernels or (), seed=args.seed,
                        rounds=args.rounds, confirm=not getattr(args, "no_confirm", False),
                        strict=getattr(args, "strict", False),
                        update_baseline=getattr(args, "update_baseline", False), out_dir=getattr(args, "out", None),
                        force_retune=getattr(args, "force_retune", False), cuda_graphs=args.cuda_graphs,
                        workers=args.workers, bench_fn=args.bench_fn, case_timeout_s=args.case_timeout,
                        config=getattr(args, "config", None), **overrides)


def existing_file(flag: str, path: str) -> Path:
    if not Path(path).is_file():
        why = "not a regular file" if Path(path).exists() else "no such file"
        raise ValueError(f"{flag}: {why}: {path}")
    return Path(path)


def os_error(exc: OSError) -> str:
    """One line naming the file (or the URL's reason) of an OSError."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    reason = exc.strerror or str(getattr(exc, "reason", None) or exc)
    return f"{where}: {reason}" if where else reason
