"""``mamba2-guard dev kernel-times``: a whole call's device time kernel by kernel, ours and mamba-ssm's, at each
shape: where a shape that loses loses. One process, eager calls under PyTorch's profiler (not the bench's
interleaved rounds: shares to read, not a speedup to claim).

    mamba2-guard dev kernel-times --shapes granite-4.0-h-tiny-z --out times.json
"""

from __future__ import annotations

import argparse
import dataclasses

from mamba2_guard.adapters.state import write_json
from mamba2_guard.bench.kernel_profile import device_events
from mamba2_guard.core.kernel_time_table import per_call, table
from mamba2_guard.dev import require_gpu
from mamba2_kernels import registry, suites


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    entry = registry.get(args.entry)  # names first, on any machine: an unknown one is one line, exit 2
    loaded = suites.load()
    shapes = [loaded.shape(name) for name in args.shapes] if args.shapes else loaded.suite(args.suite)
    require_gpu(parser, "it profiles kernels")
    report = {}
    for shape in shapes:
        inputs = entry.inputs(shape, args.seed, "cuda")
        sides = {"ours": per_call(device_events(entry.bind(entry.helion_fn(), inputs), args.calls), args.calls),
                 "mamba-ssm": per_call(device_events(entry.bind(entry.baseline_fn(), inputs), args.calls),
                                       args.calls)}
        print(f"== {entry.name} at {shape.name}\n{table(sides)}", flush=True)
        report[shape.name] = {side: [dataclasses.asdict(row) for row in rows] for side, rows in sides.items()}
    if args.out:
        write_json(args.out, {"entry": entry.name, "calls": args.calls, "seed": args.seed, "shapes": report})
        print(f"wrote {args.out}")
    return 0
