"""Measure the regression rule on a real GPU: false alarms over back-to-back A/A runs, and detection of an
injected slowdown. The numbers behind ``docs/statistics.md`` ("Measured on the H200").

    mamba2-guard dev calibrate --suite default --runs 20 --slowdown 0 --aa-timing-only \
        --json out.json
    mamba2-guard dev calibrate --shapes nemotron3-nano --runs 20 --slowdown 0.05 \
        --kernels gated_rmsnorm_bwd chunk_state --json out.json

One process, one GPU. A first bench of the kernels x shapes is the baseline (its wall time is a cold-cache
suite time when the caches are cold); a case that cannot be a baseline (an error, throttling) is listed and
left out of the figures. Then ``--runs`` A/A runs are benched and checked against it exactly
as ``mamba2-guard check`` does (same policy, a flagged case re-run in full before a regression is
declared): every non-``ok`` verdict is a false alarm. ``--aa-timing-only`` re-times the A/A runs without
re-checking precision (each case keeps the first bench's precision), which is what makes 20 runs of a whole
suite fit in one sitting. Then, unless ``--slowdown 0``, ``--runs`` runs with Helion's side slowed down: a
``torch.cuda._sleep`` kernel sized to ``--slowdown`` of the kernel's baseline median runs on the stream
right before each call, inside the timed window. The slowdown actually measured (it includes the extra
launch) is reported beside the detection rate. The JSON is rewritten (atomically) after every run, so a
run stopped by a time limit keeps what it finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch

from mamba2_guard.adapters import fingerprint
from mamba2_guard.bench.run import run_bench
from mamba2_guard.bench.timing import sleep_cycles_per_ms
from mamba2_guard.core.results import baseline_from_result, baseline_skip_reason, load_baseline
from mamba2_guard.core.verdicts import Policy
from mamba2_guard.dev import require_gpu
from mamba2_guard.flows.check import run_check
from mamba2_kernels import registry, suites
from mamba2_kernels.files import atomic_write


def slowed(entry: registry.KernelEntry, shape: str, cycles: int) -> registry.KernelEntry:
    """``entry`` whose Helion call first sleeps ``cycles`` on the GPU (registered in ``__main__``, since
    entries name their implementation by import path)."""
    fn = entry.helion_fn()

    def run(*args, **kwargs):
        torch.cuda._sleep(cycles)
        return fn(*args, **kwargs)

    name = f"slowed_{entry.name}_{shape.replace('-', '_')}"
    setattr(sys.modules["__main__"], name, run)
    return dataclasses.replace(entry, helion=f"__main__:{name}")


def verdict_runs(entries, shapes, baseline, args, fp, digest, policy, first, on_run) -> list[dict]:
    runs = []
    by_name = {e.name: e for e in entries}
    by_shape = {s.name: s for s in shapes}
    first_precision = {(c.kernel, c.shape): c.precision for c in first.cases}

    def rerun(case):
        again = run_bench([by_name[case.kernel]], [by_shape[case.shape]], fingerprint=fp, fingerprint_digest=digest,
                          state_dir=args.state_dir, suite=None, seed=case.seed, rounds=args.rounds,
                          progress=lambda _m: None)
        return again.cases[0]

    for i in range(args.runs):
        t0 = time.monotonic()
        result = run_bench(entries, shapes, fingerprint=fp, fingerprint_digest=digest, state_dir=args.state_dir,
                           suite=None, seed=args.seed + 1 + i, rounds=args.rounds, progress=lambda _m: None,
                           check_precision=not args.aa_timing_only)
        if args.aa_timing_only:
            result = dataclasses.replace(result, cases=tuple(
                dataclasses.replace(c, precision=first_precision[(c.kernel, c.shape)])
                if c.precision is None and not c.error else c for c in result.cases))
        _, verdicts = run_check(result, baseline, None, policy, rerun=rerun)
        runs.append({"run": i, "seconds": round(time.monotonic() - t0, 2),
                     "cases": [{"kernel": c.kernel, "shape": c.shape, "status": v.status, "signal": v.signal,
                                "detail": v.detail, "speedup": c.speedup, "helion_median_ms": c.helion_median_ms,
                                "sm_clock_before": (c.extra.get("clocks_before") or {}).get("sm_clock_mhz")}
                               for c, v in zip(result.cases, verdicts, strict=True)]})
        alarms = [f"{c['shape']} {c['kernel']} {c['status']}" for c in runs[-1]["cases"] if c["status"] != "ok"]
        print(f"run {i} ({runs[-1]['seconds']:.1f}s): {len(runs[-1]['cases'])} cases, "
              f"not ok: {', '.join(alarms) or 'none'}", flush=True)
        on_run(runs)
    return runs


def summarize(entries, shapes, baseline, aa, slow) -> dict:
    summary = {}
    for shape in shapes:
        for e in entries:
            base = baseline.get(e.name, shape.name)
            if base is None:
                continue

            def mine(runs, e=e, shape=shape):
                return [c for r in runs for c in r["cases"] if c["kernel"] == e.name and c["shape"] == shape.name]

            aa_status = [c["status"] for c in mine(aa)]
            row = {"baseline_helion_ms": base.helion.median_ms, "aa_runs": len(aa_status),
                   "aa_not_ok": sum(s != "ok" for s in aa_status),
                   "aa_regressions": sum(s == "regression" for s in aa_status),
                   "aa_statuses": sorted(set(aa_status))}
            slow_cases = [c for c in mine(slow) if c["helion_median_ms"] is not None]
            if slow_cases:
                row.update(injected_slowdown_measured=statistics.median(
                    c["helion_median_ms"] for c in slow_cases) / base.helion.median_ms - 1,
                    slow_runs=len(slow_cases), slow_detected=sum(c["status"] == "regression" for c in slow_cases))
            summary[f"{shape.name}/{e.name}"] = row
    return summary


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    loaded = suites.load()
    try:
        shapes = (loaded.suite(args.suite) if args.suite
                  else [loaded.shape(s) for s in args.shapes or ["nemotron3-nano"]])
        entries = [e for e in registry.select(args.kernels) if e.has_helion]
    except (KeyError, ValueError) as exc:
        parser.error(str(exc.args[0] if exc.args else exc))
    require_gpu(parser, "it times kernels")
    fp = fingerprint.collect()
    digest, policy = fp.digest(), Policy()
    out = {"gpu": fp.to_dict(), "shapes": [s.name for s in shapes], "kernels": [e.name for e in entries],
           "rounds": args.rounds, "runs": args.runs, "aa_timing_only": args.aa_timing_only,
           "slowdown_target": args.slowdown, "policy": policy.to_dict(),
           "date": time.strftime("%Y-%m-%d", time.gmtime())}
    t0 = time.monotonic()

    def save(**parts):
        out.update(parts, seconds=round(time.monotonic() - t0, 1))
        atomic_write(args.json, json.dumps(out, indent=1, default=str))

    first = run_bench(entries, shapes, fingerprint=fp.to_dict(), fingerprint_digest=digest,
                      state_dir=args.state_dir, suite=None, seed=args.seed, rounds=args.rounds)
    skipped = {f"{c.shape}/{c.kernel}": baseline_skip_reason(c) for c in first.cases if baseline_skip_reason(c)}
    save(first_bench_seconds=round(time.monotonic() - t0, 1), baseline_run=first.to_dict(), not_in_baseline=skipped)
    baseline = load_baseline(baseline_from_result(first))
    common = (entries, shapes, baseline, args, fp.to_dict(), digest, policy, first)
    aa = verdict_runs(*common, on_run=lambda runs: save(aa=runs))
    slow = []
    if args.slowdown:
        per_ms = sleep_cycles_per_ms()
        save(sleep_cycles_per_ms=per_ms)
        for shape in shapes:  # the sleep is sized per shape
            base = {e.name: baseline.get(e.name, shape.name) for e in entries}
            slow_entries = [slowed(e, shape.name, int(args.slowdown * base[e.name].helion.median_ms * per_ms))
                            for e in entries if base[e.name] is not None]
            slow += verdict_runs(slow_entries, [shape], *common[2:],
                                 on_run=lambda runs, done=list(slow): save(slow=done + runs))
    summary = summarize(entries, shapes, baseline, aa, slow)
    verdicts = sum(row["aa_runs"] for row in summary.values())
    totals = {"aa_verdicts": verdicts, "aa_not_ok": sum(row["aa_not_ok"] for row in summary.values()),
              "aa_regressions": sum(row["aa_regressions"] for row in summary.values())}
    save(summary=summary, totals=totals)
    print(json.dumps(totals, indent=1))
    return 0

