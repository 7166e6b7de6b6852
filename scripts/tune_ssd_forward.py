"""Tune the Helion SSD forward launches on the GPU and write them to the config store (a fallback to
scripts/autotune.py, which failed on the H200 run of 2026-11-29 without a visible error).

    python scripts/tune_ssd_forward.py --out kernels/configs/nvidia-h200.yaml --deadline-seconds 330 \
        --plan nemotron3-nano:chunk_scan,chunk_state,state_passing,state_passing_scan mamba2-default:chunk_scan

Each plan item is shape:kernel,...; ``state_passing_scan`` is state_passing run with variant="scan".
Every launch is tuned with helion's autotuner (effort, seed, per-launch budget as given), errors are
printed with their traceback and skipped, and each winner is saved at once (merged, atomic). No new
launch starts after the deadline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
import traceback
from pathlib import Path

import helion
import torch

from guard import fingerprint
from kernels import config_store, registry, suites
from kernels._runtime import capture_launches
from kernels.ssd import state_passing


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", nargs="+", required=True)
    parser.add_argument("--effort", default="quick")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--budget-seconds", type=int, default=25)
    parser.add_argument("--deadline-seconds", type=float, default=330)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    env = json.loads(json.dumps(fingerprint.collect().to_dict(), default=str))  # plain types for YAML
    loaded = suites.load()
    started = time.monotonic()
    for item in args.plan:
        shape_name, _, names = item.partition(":")
        shape = loaded.shape(shape_name)
        for name in names.split(","):
            if time.monotonic() - started > args.deadline_seconds:
                print(f"deadline: skipping {shape_name}:{name}", flush=True)
                continue
            entry = registry.get("state_passing" if name == "state_passing_scan" else name)
            inputs = entry.inputs(shape, args.seed, device)
            fn = entry.helion_fn()
            if name == "state_passing_scan":
                def fn(*a):
                    return state_passing.state_passing_fwd(*a, variant="scan")
            with capture_launches() as launches:
                entry._call(fn, inputs)
            for tk, kargs in launches:
                key = tk.shape_key(*kargs)
                t0 = time.monotonic()
                try:
                    kernel = helion.kernel(tk.fn, static_shapes=True, autotune_effort=args.effort,
                                           autotune_random_seed=args.seed,
                                           autotune_budget_seconds=args.budget_seconds)
                    config = dict(kernel.autotune(kargs, force=True))
                except Exception:
                    print(f"FAILED {tk.name} {key}:\n{traceback.format_exc()[-3000:]}", flush=True)
                    continue
                spent = time.monotonic() - t0
                current = config_store.load(args.out) if args.out.exists() else config_store.ConfigFile()
                current.put(tk.name, key, config)
                current.fingerprint = env
                current.tuned = {
                    "date": datetime.date.today().isoformat(), "effort": args.effort, "seed": args.seed,
                    "budget_s": args.budget_seconds, "tool": "scripts/tune_ssd_forward.py",
                    "seconds_spent": round(float(current.tuned.get("seconds_spent", 0)) + spent, 1),
                }
                config_store.save(args.out, current)
                print(json.dumps({"kernel": tk.name, "shape": shape_name, "key": str(key),
                                  "seconds": round(spent, 1), "config": config}), flush=True)
    print(f"tuning done in {time.monotonic() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
