"""``mamba2-guard dev measure-selection``, ``dev warm`` and ``dev first-call``: the GPU halves of the config
selection (``mamba2_guard.flows.selection_measure``): time how stored configs transfer across a grid of shapes,
precompile the configs the runtime selects for a suite's shapes, and time a job's first call at a shape, ours and
mamba-ssm's."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone

from mamba2_guard.adapters import fingerprint
from mamba2_guard.dev import require_gpu
from mamba2_guard.flows import baselines, selection_measure
from mamba2_kernels import config_store, registry, suites


def _shape_names(args: argparse.Namespace) -> list[str]:
    loaded = suites.load()
    if args.shapes:
        return [loaded.shape(name).name for name in args.shapes]
    return [shape.name for shape in loaded.suite(args.suite)]


def measure(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    shapes = _shape_names(args)  # names first, on any machine: an unknown one is one line, exit 2
    require_gpu(parser, "it times the stored configs")
    gpu_slug = args.gpu_slug or fingerprint.gpu_slug(fingerprint.collect())
    selection_measure.measure(shapes, config=config_store.path_for(gpu_slug), seed=args.seed,
                      rounds=args.rounds, processes=args.processes, out=args.out, paths_only=args.paths_only)
    print(f"measurements in {args.out}; fit them into {gpu_slug}'s file with: mamba2-guard fit-selection "
          f"{args.out} --gpu-slug {gpu_slug}")
    return 0


def _entry_names(args: argparse.Namespace) -> list[str]:
    return [registry.get(name).name for name in args.entries]  # an unknown name: one line, exit 2 (KeyError)


def warm(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    print(json.dumps(selection_measure.warm(_shape_names(args), _entry_names(args), args.processes, args.baseline)))
    return 0


def first_call(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    shapes, entries = _shape_names(args), _entry_names(args)
    caches = "empty" if args.empty_caches else "environment"
    if args.missing_only and not args.record:
        parser.error("--missing-only: skips what --record kept; give --record too")
    if args.record:
        require_gpu(parser, "--record keeps the seconds per GPU model")
        if set(args.sides) != {"helion", "mamba_ssm"}:
            parser.error("--record: needs both --sides (ours and mamba-ssm's), the pair the file keeps")
        fp = fingerprint.collect()
        path = baselines.first_call_path(fingerprint.gpu_slug(fp))
        if args.missing_only:
            kept = baselines.read_first_calls(path)
            done = [name for name in shapes if name in kept and kept[name]["entries"] == entries
                    and kept[name]["caches"] == caches]
            shapes = [name for name in shapes if name not in done]
            print(f"{path} holds {', '.join(done) or 'none of them'}; measuring {', '.join(shapes) or 'nothing'}",
                  flush=True)

    def finished(shape: str, by_side: dict) -> None:
        print(shape, " ".join(f"{side} {value:.1f} s" if isinstance(value, float) else f"{side} {value}"
                              for side, value in by_side.items()), flush=True)
        if args.record:  # shape by shape: a run cut short keeps what it measured
            left_out = baselines.record_first_calls(
                path, {shape: by_side}, entries=entries, caches=caches,
                measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), gpu_uuid=fp.gpu_uuid)
            print(f"  {'not recorded (a side failed)' if left_out else 'recorded'} in {path}", flush=True)

    seconds = selection_measure.first_call_seconds(shapes, entries, args.sides, args.empty_caches, on_shape=finished)
    print(json.dumps(seconds))
    if args.record:
        print("then regenerate the results page: python docs/results/build.py")
    return 0
