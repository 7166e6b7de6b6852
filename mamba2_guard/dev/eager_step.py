"""``mamba2-guard dev eager-step``: the SSD call as an eager training loop sees it, host included, ours and
mamba-ssm's, beside the device-time ratio the bench reports.

The bench times a whole call by CUDA-graph replays: its device work alone. An eager loop without graphs also
pays the host's work per call (argument checks, config lookups, Helion's binding, autograd, ~15 launches),
and where that outlasts the GPU's work, as at short sequences, it sets the step time. For each shape (and
each ``--seqlens`` length put in its place) this times the forward (``ssd_combined_fwd``) and the training
step (``ssd_combined_fwd_bwd``: forward and backward through autograd) both ways, interleaved:

  * ``wall``: ``--steps`` calls back to back with one synchronize after them (``bench.timing.wall_interleaved``);
  * ``device``: the same calls as CUDA-graph replays (``Timer.interleaved_graphs``, the bench's method);
  * with ``--compiled``, ours under ``torch.compile(fullgraph=True, dynamic=True)`` too, in the wall comparison.

``host_cost`` is how far the wall ratio falls below the device ratio (0.05: the eager loop keeps 95 % of the
kernels' advantage). Writes one JSON file, after every case; a case that fails is recorded with its error.

    mamba2-guard dev eager-step --suite zoo-steered --seqlens 1024 2048 4096 --compiled --out eager.json
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mamba2_guard.adapters import fingerprint
from mamba2_guard.adapters.state import write_json
from mamba2_guard.bench.timing import Timer, synchronizer, wall_interleaved
from mamba2_guard.core import stats
from mamba2_guard.dev import require_gpu
from mamba2_kernels import registry, suites

ENTRIES = ("ssd_combined_fwd", "ssd_combined_fwd_bwd")


def cases(shapes: Sequence[suites.ShapeSpec], seqlens: Sequence[int]) -> list[suites.ShapeSpec]:
    """Each shape as it is, then with each of ``seqlens`` as its sequence length (named ``<shape>@L<n>``)."""
    out = []
    for shape in shapes:
        out.append(shape)
        out.extend(dataclasses.replace(shape, name=f"{shape.name}@L{n}", seqlen=n) for n in seqlens
                   if n != shape.seqlen)
    return out


def compare(samples: dict[str, list[float]]) -> dict[str, Any]:
    out = {"median_ms": {side: stats.median(values) for side, values in samples.items()},
           "speedup_vs_mamba_ssm": stats.speedup(samples["helion"], samples["mamba_ssm"])}
    if "helion_compiled" in samples:  # above 1: the compiled call is the faster
        out["compiled_vs_eager"] = stats.speedup(samples["helion_compiled"], samples["helion"])
    return out


def measure(entry: registry.KernelEntry, shape: suites.ShapeSpec, *, device: torch.device, seed: int, rounds: int,
            steps: int, graphs: Timer | None, compile_backend: str | None = None) -> dict[str, Any]:
    """One entry at one shape: the wall comparison and, with ``graphs``, the device-time one and the host cost.
    With ``compile_backend``, also our call under ``torch.compile(fullgraph=True, dynamic=True)`` in the wall
    comparison: what a compiled training step gets from the custom operators against the eager one."""
    inputs = entry.inputs(shape, seed, device)
    fns = {"helion": entry.bind(entry.helion_fn(), inputs), "mamba_ssm": entry.bind(entry.baseline_fn(), inputs)}
    walls = dict(fns)
    if compile_backend is not None:
        compiled = torch.compile(entry.helion_fn(), fullgraph=True, dynamic=True, backend=compile_backend)
        walls["helion_compiled"] = entry.bind(compiled, inputs)
    out: dict[str, Any] = {"wall": compare(wall_interleaved(walls, rounds=rounds, steps=steps,
                                                            synchronize=synchronizer(device)))}
    if graphs is not None:
        out["device"] = compare(graphs.interleaved_graphs(fns, rounds=rounds))
        wall, dev = out["wall"]["speedup_vs_mamba_ssm"], out["device"]["speedup_vs_mamba_ssm"]
        out["host_cost"] = round(1 - wall / dev, 4) if wall and dev else None
    return out


def _shown(value: float | None, form: str, unit: str = "") -> str:
    """A number for the progress line; "n/a" where a side had no usable sample."""
    return format(value, form) + unit if isinstance(value, (int, float)) else "n/a"


def line(entry: str, shape: str, result: dict[str, Any]) -> str:
    wall = result["wall"]
    text = (f"{shape} {entry}: eager ours {wall['median_ms']['helion']:.3f} ms, mamba-ssm "
            f"{wall['median_ms']['mamba_ssm']:.3f} ms, {_shown(wall['speedup_vs_mamba_ssm'], '.2f', 'x')}")
    if "compiled_vs_eager" in wall:
        text += (f"; compiled {wall['median_ms']['helion_compiled']:.3f} ms "
                 f"({_shown(wall['compiled_vs_eager'], '.2f', 'x')} eager)")
    if "device" in result:
        text += (f"; device {_shown(result['device']['speedup_vs_mamba_ssm'], '.2f', 'x')}, "
                 f"host cost {_shown(result['host_cost'], '+.1%')}")
    return text


def measure_all(shapes: Sequence[suites.ShapeSpec], report: dict[str, Any], out: Path, *, device: torch.device,
                seed: int, rounds: int, steps: int, graphs: Timer | None,
                compile_backend: str | None = None) -> dict[str, Any]:
    """Every entry at every shape into ``report["cases"]``, written to ``out`` after each case, so that a run
    cut short keeps what it measured. A case that fails (out of memory at a long shape, a call that raises)
    is recorded with its error and the run goes on, as the bench's cases do."""
    for shape in shapes:
        for name in ENTRIES:
            try:
                result = measure(registry.get(name), shape, device=device, seed=seed, rounds=rounds, steps=steps,
                                 graphs=graphs, compile_backend=compile_backend)
                text = line(name, shape.name, result)
            except Exception as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"}
                text = f"{shape.name} {name}: FAILED {result['error']}"
            report["cases"].setdefault(shape.name, {})[name] = result
            print(text, flush=True)
            write_json(out, report)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return report


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    loaded = suites.load()  # names first, on any machine: an unknown one is one line, exit 2
    shapes = cases([loaded.shape(name) for name in args.shapes] if args.shapes else loaded.suite(args.suite),
                   args.seqlens or ())
    require_gpu(parser, "it times the calls on the GPU")
    device = torch.device("cuda")
    report: dict[str, Any] = {"fingerprint": fingerprint.collect().to_dict(),
                              "date": time.strftime("%Y-%m-%d", time.gmtime()), "rounds": args.rounds,
                              "steps": args.steps, "seed": args.seed, "compiled": args.compiled, "cases": {}}
    measure_all(shapes, report, args.out, device=device, seed=args.seed, rounds=args.rounds, steps=args.steps,
                graphs=Timer(device), compile_backend="inductor" if args.compiled else None)
    return 0
