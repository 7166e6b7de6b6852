"""``mamba2-guard dev measure-selection``, ``dev warm`` and ``dev first-call``: the GPU halves of the config
selection (``guard.flows.selection``): time how stored configs transfer across a grid of shapes, precompile the
configs the runtime selects for a suite's shapes, and time a job's first call at a shape, ours and mamba-ssm's."""

from __future__ import annotations

import argparse
import json

from guard.dev import require_gpu
from guard.flows import selection
from kernels import config_store, registry, suites


def _shape_names(args: argparse.Namespace) -> list[str]:
    loaded = suites.load()
    if args.shapes:
        return [loaded.shape(name).name for name in args.shapes]
    return [shape.name for shape in loaded.suite(args.suite)]


def measure(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    shapes = _shape_names(args)  # names first, on any machine: an unknown one is one line, exit 2
    require_gpu(parser, "it times the stored configs")
    selection.measure(shapes, config=config_store.path_for(args.gpu_slug), seed=args.seed,
                      rounds=args.rounds, processes=args.processes, out=args.out, paths_only=args.paths_only)
    print(f"measurements in {args.out}; fit them with: mamba2-guard autotune --fit-selection {args.out}")
    return 0


def _entry_names(args: argparse.Namespace) -> list[str]:
    return [registry.get(name).name for name in args.entries]  # an unknown name: one line, exit 2 (KeyError)


def warm(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    print(json.dumps(selection.warm(_shape_names(args), _entry_names(args), args.processes, args.baseline)))
    return 0


def first_call(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    seconds = selection.first_call_seconds(_shape_names(args), _entry_names(args), args.sides,
                                           args.empty_caches)
    for shape, by_side in seconds.items():
        print(shape, " ".join(f"{side} {value:.1f} s" if isinstance(value, float) else f"{side} {value}"
                              for side, value in by_side.items()))
    print(json.dumps(seconds))
    return 0
