"""``mamba2-guard bench``: precision and interleaved timing of kernels x shapes, resumable."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mamba2_guard.adapters import files
from mamba2_guard.commands import common

if TYPE_CHECKING:
    from mamba2_guard.core.results import BenchResult


def register(commands) -> None:
    p = common.add_command(commands, "bench", "precision and interleaved timing of kernels x shapes")
    common.selection_arguments(p, "default")
    common.run_arguments(p)
    p.add_argument("--json", metavar="PATH", type=files.creatable_file,
                   help="where to write the result (default: the state dir); "
                   "rewritten after every case")
    p.add_argument("--resume", action="store_true", help="continue --json PATH where a stopped run left it: keep "
                   "its cases (same environment, GPU, seed, rounds and timing) and measure the rest, and again "
                   "those that failed or ran throttled")
    p.add_argument("--update-baseline", action="store_true", help="write baselines/<gpu-slug>.yaml")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Bench the selection; write the result JSON; optionally the baseline. Exit 1 on a precision failure
    or error (speed is judged by ``check``)."""
    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.bench import shard
    from mamba2_guard.flows import baselines
    from mamba2_guard.flows.nightly import selection
    from mamba2_kernels.files import atomic_write

    if args.resume and not args.json:
        raise ValueError("--resume: needs --json PATH, the result file to continue")
    progress = common.progress()
    options = common.cycle_options(args)
    if common.use_cpu_interpret():
        from mamba2_kernels.testing import enable_cpu_interpret

        enable_cpu_interpret()
    suite, entries, shapes = selection(options, progress)
    fp = fingerprint.collect()
    state = Path(args.state_dir)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(args.json) if args.json else state / common.RESULTS_DIR / f"{stamp}{common.RESULT_SUFFIX}"
    planned = {(shape.name, entry.name) for shape in shapes for entry in entries}
    kept = kept_cases(args, out, fp.to_dict(), planned) if args.resume else None

    def write(result: BenchResult) -> None:  # after every case too: a killed run keeps what it measured
        atomic_write(out, json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n")

    result = shard.bench(entries, shapes, fingerprint=fp.to_dict(), fingerprint_digest=fp.digest(), state_dir=state,
                         suite=suite, seed=args.seed, rounds=args.rounds, progress=progress,
                         cuda_graphs=args.cuda_graphs, workers=args.workers, bench_fn=args.bench_fn,
                         case_timeout_s=args.case_timeout, resumed=kept, checkpoint=write)
    write(result)
    from mamba2_guard.core import report

    common.console().print(report.bench_table(result))
    atomic_write(state / common.RESULTS_DIR / common.LAST_BENCH, f"{out.resolve()}\n")
    print(f"result: {out} (`mamba2-guard check` judges it against the baseline)")
    if args.update_baseline:
        path = baselines.path_for(fingerprint.gpu_slug(fp))
        left_out = baselines.update(path, result)
        print(f"baseline: {path}" + (f" (left out: {', '.join(left_out)})" if left_out else ""))
    bad = [c for c in result.cases if c.error or (c.precision is not None and c.precision.ok is False)]
    return common.EXIT_FAIL if bad else common.EXIT_OK


def kept_cases(args: argparse.Namespace, out: Path, fingerprint: dict[str, Any], planned: set[tuple[str, str]]
               ) -> BenchResult | None:
    """``bench --resume``: the cases of ``out`` that this run of ``planned`` (shape, kernel) cases keeps (None
    where the file is not there yet)."""
    import dataclasses

    from mamba2_guard.bench.timing import measured_under
    from mamba2_guard.core.results import kept_on_resume
    from mamba2_guard.flows import baselines

    if not out.exists():
        return None
    try:
        prior = baselines.read_result(out)
    except ValueError as exc:
        raise ValueError(f"--resume: {exc}") from None
    try:
        kept = kept_on_resume(prior, measured_under(fingerprint),
                              {"seed": args.seed, "rounds": args.rounds, "cuda_graphs": args.cuda_graphs}, planned)
    except ValueError as exc:
        raise ValueError(f"--resume: {out}: {exc}") from None
    return dataclasses.replace(prior, cases=kept)
