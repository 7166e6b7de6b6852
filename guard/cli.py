"""The ``mamba2-guard`` command line. Thin: each command composes the pieces of ``guard``.

Exit codes: 0 all good, 1 a regression or precision failure, 2 a usage or environment error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from guard import EnvironmentProblem, check_kernels_package

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
log = logging.getLogger("guard")


def default_state_dir() -> Path:
    override = os.environ.get("MAMBA2_GUARD_STATE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "mamba2-guard"


def _console():
    from rich.console import Console

    return Console(stderr=False, highlight=False)


def _use_cpu_interpret() -> bool:
    import torch

    return not torch.cuda.is_available()


def cmd_doctor(args: argparse.Namespace) -> int:
    from kernels import _mamba_ssm

    problems = []
    try:
        _mamba_ssm.module(_mamba_ssm.SSD_COMBINED)
    except ImportError as exc:
        problems.append(f"mamba-ssm: {exc}")
    try:
        import helion  # noqa: F401
    except ImportError as exc:
        problems.append(f"helion does not import: {exc}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if not args.quiet:
        cmd_fingerprint(argparse.Namespace(json=False))
    if not problems and not args.quiet:
        print("mamba2-guard: environment ok")
    return EXIT_USAGE if problems else EXIT_OK


def cmd_fingerprint(args: argparse.Namespace) -> int:
    from guard import fingerprint

    fp = fingerprint.collect()
    data = fp.to_dict()
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return EXIT_OK
    from rich.table import Table

    table = Table(title=f"fingerprint {fp.digest()[:12]} ({fingerprint.gpu_slug(fp)})")
    table.add_column("field")
    table.add_column("value")
    for key, value in data.items():
        if key != "kernel_sources":
            table.add_row(key, "-" if value is None else str(value))
    _console().print(table)
    return EXIT_OK


def _selected(args: argparse.Namespace):
    from kernels import registry, suites

    loaded = suites.load()
    shapes = [loaded.shape(s) for s in args.shapes] if args.shapes else loaded.suite(args.suite)
    return registry.select(args.kernels or None), shapes


def cmd_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    entries, shapes = _selected(args)
    table = Table(title=f"suite: {', '.join(s.name for s in shapes)}")
    for column in ("kernel", "family", "phase", "replaces", "helion", "GB moved", "GFLOP"):
        table.add_column(column)
    for entry in entries:
        status = "implemented" if entry.has_helion else "[red]missing[/red]"
        table.add_row(entry.name, entry.family, entry.phase, entry.replaces, status,
                      " / ".join(f"{entry.bytes_moved(s) / 1e9:.3g}" for s in shapes),
                      " / ".join(f"{entry.flops(s) / 1e9:.3g}" for s in shapes))
    _console().print(table)
    return EXIT_OK


def cmd_precision(args: argparse.Namespace) -> int:
    """Run the selected kernels once and compare them with mamba-ssm and the fp64 reference."""
    from guard.bench.runner import precision_case

    cpu = _use_cpu_interpret()
    if cpu:
        from kernels.testing import enable_cpu_interpret

        enable_cpu_interpret()
        if not args.shapes and args.suite != "smoke":
            print(f"no GPU: running the smoke suite in CPU interpret mode instead of {args.suite!r}")
            args.suite = "smoke"
    entries, shapes = _selected(args)
    device = "cpu" if cpu else "cuda"
    cases = []
    for shape in shapes:
        for entry in entries:
            started = time.monotonic()
            case = precision_case(entry, shape, args.seed, device)
            worst = max((o.max_rel_err_vs_fp64 for o in case.outputs), default=None)
            detail = f"max rel err vs fp64 {worst:.2e}" if worst is not None else (case.error or "")
            print(f"[{shape.name}] {entry.name:32s} {case.status:15s} {detail} ({time.monotonic() - started:.1f}s)",
                  flush=True)
            cases.append(case)
    if args.json:
        from kernels.config_store import atomic_write_text

        atomic_write_text(Path(args.json), json.dumps([c.to_dict() for c in cases], indent=2) + "\n")
    counts = {status: sum(c.status == status for c in cases) for status in sorted({c.status for c in cases})}
    print("summary: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return EXIT_FAIL if any(c.status in ("precision-fail", "error") for c in cases) else EXIT_OK


def cmd_nightly(args: argparse.Namespace) -> int:
    """One cycle, with what the guard can do today: fingerprint, suite, precision check."""
    state = Path(args.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    print(f"state directory: {state}")
    cmd_fingerprint(argparse.Namespace(json=False))
    cmd_list(args)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    args.json = str(state / "reports" / f"precision-{stamp}.json")
    code = cmd_precision(args)
    print(f"report: {args.json}")
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mamba2-guard", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def selection(p: argparse.ArgumentParser, suite: str) -> None:
        p.add_argument("--suite", default=suite, help=f"shape suite from kernels/suites.yaml (default {suite})")
        p.add_argument("--shapes", nargs="+", metavar="SHAPE", help="shape names instead of a suite")
        p.add_argument("--kernels", nargs="+", metavar="KERNEL", help="kernel names (default: all)")

    p = sub.add_parser("doctor", help="check the installation")
    p.add_argument("--quiet", action="store_true", help="print only problems")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("fingerprint", help="print the environment fingerprint")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fingerprint)

    p = sub.add_parser("list", help="list kernels and shapes of a suite")
    selection(p, "default")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("precision", help="compare kernels with mamba-ssm and the fp64 reference")
    selection(p, "default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the cases as JSON")
    p.set_defaults(func=cmd_precision)

    p = sub.add_parser("nightly", help="one nightly cycle")
    selection(p, "default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--state-dir", default=str(default_state_dir()), help="default: %(default)s")
    p.set_defaults(func=cmd_nightly)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        check_kernels_package()
        return args.func(args)
    except EnvironmentProblem as exc:
        print(f"mamba2-guard: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"mamba2-guard: {message}", file=sys.stderr)
        return EXIT_USAGE
