"""Time the Helion SSD forward kernels against mamba-ssm's wrappers on the GPU, interleaved, L2 flushed.

    python scripts/bench_ssd_forward.py --shapes nemotron3-nano long-context mamba2-default \
        --out baselines/runs/h200-forward-measurements.json

For each kernel x shape: the registry's seeded inputs (seed 0), a precision check of Helion against
mamba-ssm (|ours - mamba| <= 1e-2 + 1e-2 |mamba|), then ``guard.bench.timing.Timer.interleaved``
(ABBA rounds, L2 cleared before each call) of both public functions, whole calls as users make them.
state_passing is timed in both variants (loop, scan). Config lookups that fell back are recorded.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

import torch

from guard import fingerprint
from guard.bench.timing import Timer
from kernels import config_store, registry, suites
from kernels.ssd import state_passing

KERNELS = ("chunk_cumsum", "chunk_state", "state_passing", "bmm_chunk", "chunk_scan")


def _check(ours: dict, theirs: dict) -> dict:
    worst = {}
    for name, ref in theirs.items():
        got = ours[name].float()
        ref = ref.float()
        excess = ((got - ref).abs() - (1e-2 + 1e-2 * ref.abs())).max().item()
        worst[name] = {"max_abs_err": (got - ref).abs().max().item(), "ok": excess <= 0}
    return worst


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["nemotron3-nano", "long-context", "mamba2-default"])
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    timer = Timer(device)
    loaded = suites.load()
    results = []
    for shape_name in args.shapes:
        shape = loaded.shape(shape_name)
        for name in args.kernels:
            entry = registry.get(name)
            inputs = entry.inputs(shape, 0, device)
            variants = {"helion": entry.helion_fn()}
            if name == "state_passing":
                fn = state_passing.state_passing_fwd
                variants = {"helion": lambda *a, _f=fn: _f(*a, variant="loop"),
                            "helion_scan": lambda *a, _f=fn: _f(*a, variant="scan")}
            base = entry.baseline_fn()
            row = {"kernel": name, "shape": shape_name}
            before = dict(config_store.FALLBACKS)
            try:
                ref = entry._call(base, inputs)
                call_args = tuple(inputs[a] for a in entry.args)
                fns = {"mamba_ssm": lambda f=base, a=call_args: f(*a)}
                for vname, vfn in variants.items():
                    row[f"precision_{vname}"] = _check(entry._call(vfn, inputs), ref)
                    fns[vname] = lambda f=vfn, a=call_args: f(*a)
                samples = timer.interleaved(fns, rounds=args.rounds, warmup=3)
                med = {k: statistics.median(v) for k, v in samples.items()}
                row["median_ms"] = med
                for vname in variants:
                    ratios = sorted(b / a for a, b in zip(samples[vname], samples["mamba_ssm"], strict=True))
                    row[f"speedup_{vname}"] = med["mamba_ssm"] / med[vname]
                    row[f"speedup_{vname}_p10_p90"] = [ratios[len(ratios) // 10], ratios[(9 * len(ratios)) // 10]]
                row["bytes_model"] = entry.bytes_moved(shape)
                row["gbps_helion"] = row["bytes_model"] / (med["helion"] * 1e-3) / 1e9
                row["gbps_mamba_ssm"] = row["bytes_model"] / (med["mamba_ssm"] * 1e-3) / 1e9
            except Exception as exc:  # record and go on: one broken kernel must not lose the others
                row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            after = dict(config_store.FALLBACKS)
            row["config_fallbacks"] = {f"{k[0]}:{k[1]}": after[k] - before.get(k, 0) for k in after
                                       if after[k] != before.get(k, 0)}
            print(json.dumps(row), flush=True)
            results.append(row)
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tool": "scripts/bench_ssd_forward.py",
        "method": f"guard.bench.timing.Timer.interleaved, {args.rounds} ABBA rounds, L2 flushed, whole "
                  "public-function calls (host included), median ms; registry inputs seed 0",
        "fingerprint": fingerprint.collect().to_dict(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
