"""Tune the Helion launches of registry kernels at suite shapes and write them to the config store.

    python scripts/autotune.py --kernels chunk_state chunk_scan --shapes nemotron3-nano \
        --effort quick --seed 1234 --budget-seconds 120 [--out kernels/configs/nvidia-h200.yaml]

For each kernel x shape it builds the registry's seeded inputs on the GPU, runs the kernel's public
function once while recording every Helion launch (``kernels._runtime.capture_launches``), and runs
Helion's autotuner on each distinct (launch, shape key) with the given effort, random seed and budget,
warm-started from the committed config where there is one. Each winner is saved the moment it is found
(atomically, merged into the existing file), so a killed run keeps what it finished. The file's ``tuned``
section records the seed, effort, budget and time spent. ``mamba2-guard autotune`` will supersede this.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

from guard import fingerprint
from kernels import config_store, registry, suites
from kernels._runtime import capture_launches, device_slug


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", required=True)
    parser.add_argument("--shapes", nargs="+", required=True)
    parser.add_argument("--effort", choices=("quick", "full"), default="quick")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--budget-seconds", type=int, default=300, help="per launch")
    parser.add_argument("--out", type=Path, help="config file (default: kernels/configs/<gpu-slug>.yaml)")
    parser.add_argument("--log", type=Path, help="JSON lines log of each tuned launch")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("autotune needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    out = args.out or config_store.path_for(device_slug(device))
    loaded = suites.load()
    entries = [registry.get(k) for k in args.kernels]
    shapes = [loaded.shape(s) for s in args.shapes]
    env = fingerprint.collect().to_dict()
    started = time.monotonic()
    for shape in shapes:
        for entry in entries:
            inputs = entry.inputs(shape, args.seed, device)
            with capture_launches() as launches:
                entry.run_helion(inputs)
            seen = set()
            for kernel, kernel_args in launches:
                key = kernel.shape_key(*kernel_args)
                if (kernel.name, key) in seen:
                    continue
                seen.add((kernel.name, key))
                current = config_store.load(out) if out.exists() else config_store.ConfigFile()
                seed_config = current.get(kernel.name, key)
                settings = {"autotune_effort": args.effort, "autotune_random_seed": args.seed,
                            "autotune_budget_seconds": args.budget_seconds}
                if seed_config is not None:
                    settings["autotune_seed_configs"] = [seed_config]
                t0 = time.monotonic()
                tuner = kernel.helion_kernel(None, "compiled", **settings)
                best = tuner.autotune(kernel_args, force=True)
                spent = time.monotonic() - t0
                config = dict(best)
                current = config_store.load(out) if out.exists() else config_store.ConfigFile()
                current.put(kernel.name, key, config)
                current.fingerprint = env
                current.tuned = {
                    "date": datetime.date.today().isoformat(), "effort": args.effort, "seed": args.seed,
                    "budget_s": args.budget_seconds, "tool": "scripts/autotune.py",
                    "seconds_spent": round(float(current.tuned.get("seconds_spent", 0)) + spent, 1),
                }
                config_store.save(out, current)
                line = {"kernel": kernel.name, "entry": entry.name, "shape": shape.name, "key": str(key),
                        "seconds": round(spent, 1), "config": config}
                print(json.dumps(line), flush=True)
                if args.log:
                    with args.log.open("a") as handle:
                        handle.write(json.dumps(line) + "\n")
    print(f"tuned in {time.monotonic() - started:.0f}s -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
