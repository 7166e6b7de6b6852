"""Measure the regression rule on a real GPU: false alarms over back-to-back A/A runs, and detection of an
injected slowdown. The numbers behind ``docs/statistics.md`` ("Measured on the H200").

    python scripts/calibrate_regression_rule.py --shape nemotron3-nano --runs 20 --slowdown 0.05 \
        --kernels chunk_scan_chunk_state_bwd_dx gated_rmsnorm_bwd chunk_state --json out.json

One process, one GPU. A first bench of the kernels is the baseline. Then ``--runs`` A/A runs are benched
and checked against it exactly as ``mamba2-guard check`` does (same policy, a flagged case re-run before a
regression is declared): every non-``ok`` verdict is a false alarm. Then ``--runs`` runs with Helion's
side slowed down: a ``torch.cuda._sleep`` kernel sized to ``--slowdown`` of the kernel's baseline median
runs on the stream right before each call, inside the timed window. The slowdown actually measured (it
includes the extra launch) is reported beside the detection rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from guard import fingerprint
from guard.bench.run import run_bench
from guard.checking import run_check
from guard.core.results import baseline_from_result, load_baseline
from guard.core.verdicts import Policy
from kernels import registry, suites


def sleep_cycles_per_ms() -> float:
    """How many ``torch.cuda._sleep`` cycles take one millisecond on this GPU (median of 10)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles, times = 2_000_000, []
    for _ in range(10):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return cycles / statistics.median(times)


def slowed(entry: registry.KernelEntry, cycles: int) -> registry.KernelEntry:
    """``entry`` whose Helion call first sleeps ``cycles`` on the GPU (registered in ``__main__``, since
    entries name their implementation by import path)."""
    fn = entry.helion_fn()

    def run(*args, **kwargs):
        torch.cuda._sleep(cycles)
        return fn(*args, **kwargs)

    name = f"slowed_{entry.name}"
    setattr(sys.modules["__main__"], name, run)
    return dataclasses.replace(entry, helion=f"__main__:{name}")


def verdict_runs(entries, shape, baseline, args, fp, digest, state_dir, policy) -> list[dict]:
    runs = []
    by_name = {e.name: e for e in entries}

    def rerun(case):
        again = run_bench([by_name[case.kernel]], [shape], fingerprint=fp, fingerprint_digest=digest,
                          state_dir=state_dir, suite=None, seed=case.seed, rounds=args.rounds,
                          progress=lambda _m: None)
        return again.cases[0]

    for i in range(args.runs):
        t0 = time.monotonic()
        result = run_bench(entries, [shape], fingerprint=fp, fingerprint_digest=digest, state_dir=state_dir,
                           suite=None, seed=args.seed + 1 + i, rounds=args.rounds, progress=lambda _m: None)
        _, verdicts = run_check(result, baseline, None, policy, rerun=rerun)
        runs.append({"run": i, "seconds": round(time.monotonic() - t0, 2),
                     "cases": [{"kernel": c.kernel, "status": v.status, "speedup": c.speedup,
                                "helion_median_ms": c.helion_median_ms}
                               for c, v in zip(result.cases, verdicts, strict=True)]})
        print(f"run {i}: " + ", ".join(f"{c['kernel']} {c['status']}" for c in runs[-1]["cases"]), flush=True)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="nemotron3-nano")
    parser.add_argument("--kernels", nargs="+", required=True)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--slowdown", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--state-dir", type=Path, default=Path("/tmp/mamba2-guard-calibration"))
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    if not 0 < args.slowdown < 1:
        parser.error(f"--slowdown: expected a fraction in (0, 1), got {args.slowdown}")
    if args.runs < 1:
        parser.error(f"--runs: expected at least 1, got {args.runs}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: it times kernels")
    shape = suites.load().shape(args.shape)
    entries = [registry.get(k) for k in args.kernels]
    fp = fingerprint.collect()
    digest, policy = fp.digest(), Policy()
    t0 = time.monotonic()
    first = run_bench(entries, [shape], fingerprint=fp.to_dict(), fingerprint_digest=digest,
                      state_dir=args.state_dir, suite=None, seed=args.seed, rounds=args.rounds)
    baseline = load_baseline(baseline_from_result(first, strict=True))
    common = (shape, baseline, args, fp.to_dict(), digest, args.state_dir, policy)
    aa = verdict_runs(entries, *common)
    per_ms = sleep_cycles_per_ms()
    slow_entries = [slowed(e, int(args.slowdown * baseline.get(e.name, shape.name).helion.median_ms * per_ms))
                    for e in entries]
    slow = verdict_runs(slow_entries, *common)
    summary = {}
    for e in entries:
        base_ms = baseline.get(e.name, shape.name).helion.median_ms
        aa_status = [c["status"] for r in aa for c in r["cases"] if c["kernel"] == e.name]
        slow_cases = [c for r in slow for c in r["cases"] if c["kernel"] == e.name]
        summary[e.name] = {
            "baseline_helion_ms": base_ms,
            "aa_runs": len(aa_status), "aa_false_alarms": sum(s != "ok" for s in aa_status),
            "aa_statuses": sorted(set(aa_status)),
            "injected_slowdown_measured": statistics.median(c["helion_median_ms"] for c in slow_cases) / base_ms - 1,
            "slow_runs": len(slow_cases), "slow_detected": sum(c["status"] == "regression" for c in slow_cases),
        }
    out = {"gpu": fp.to_dict(), "shape": args.shape, "rounds": args.rounds, "runs": args.runs,
           "slowdown_target": args.slowdown, "sleep_cycles_per_ms": per_ms,
           "policy": policy.to_dict(), "seconds": round(time.monotonic() - t0, 1),
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "summary": summary, "aa": aa, "slow": slow,
           "baseline_run": first.to_dict()}
    args.json.write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
