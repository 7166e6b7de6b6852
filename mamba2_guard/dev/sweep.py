"""Hand-picked configs against the stored ones, timed on the GPU: what the autotuner's search can miss.

Helion's autotuner samples a huge space within a time budget. On the H200 it had left chunk_scan 20 % and
the dx kernel 16 % short of configs found by timing a few hand-picked variants (4 warps, the dstate and
chunk loops in different blocks; docs/kernels.md, "Configs the autotuner missed"). For each job of a spec this times,
interleaved with L2 flushed before each call (guard's Timer, device time): mamba-ssm's function, ours on the
stored configs, and the job's kernel alone on its stored config and on each variant (the stored config with
the variant's keys laid over it). Each variant's public outputs are compared with the stored config's
(``--no-precision`` skips that; ``mamba2-guard bench`` judges the precision of whatever gets stored).

Spec (JSON): [{"entry": ENTRY, "kernel": KERNEL, "shapes": [SHAPE, ...], "variants": [{KEY: VALUE}, ...]}]
KERNEL is a Helion kernel the entry launches (its name in mamba2_kernels/configs). An "indexing" given as one
string ("tensor_descriptor") applies to every load.

    mamba2-guard dev sweep spec.json --out sweep.json              # on the GPU runner
    mamba2-guard dev sweep spec.json --out sweep.json --device cpu # the plumbing only, no timing

A winner goes into mamba2_kernels/configs/<gpu>.yaml (``mamba2_kernels.config_store``), then through
``mamba2-guard bench``.
With ``--device cpu`` the kernels run in Triton's interpreter (set ``TRITON_INTERPRET=1``) and nothing is
timed: a check of the spec and of the variants' validity and outputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from mamba2_kernels import registry, suites  # noqa: E402
from mamba2_kernels.files import UnreadableFile, atomic_write, load_json
from mamba2_kernels.tuning import capture_launches, complete_config, pinned_config, validate_config  # noqa: E402

STORED = "stored"


@dataclass(frozen=True)
class Job:
    entry: str
    kernel: str
    shapes: tuple[str, ...]
    variants: tuple[dict[str, Any], ...]


def parse_spec(raw: Any) -> list[Job]:
    """The spec's jobs, or ValueError naming the first field that is wrong and what it should be."""
    if not isinstance(raw, list) or not raw:
        raise ValueError("spec: expected a non-empty JSON list of jobs")
    known_shapes = set(suites.load().shapes)
    jobs = []
    for index, item in enumerate(raw):
        where = f"spec[{index}]"
        if not isinstance(item, dict) or set(item) != {"entry", "kernel", "shapes", "variants"}:
            raise ValueError(f"{where}: expected an object with exactly entry, kernel, shapes and variants")
        if item["entry"] not in registry.REGISTRY:
            raise ValueError(f"{where}.entry: expected a registry entry, got {item['entry']!r}")
        if not isinstance(item["kernel"], str) or not item["kernel"]:
            raise ValueError(f"{where}.kernel: expected a kernel name, got {item['kernel']!r}")
        shapes = item["shapes"]
        known = isinstance(shapes, list) and all(isinstance(shape, str) and shape in known_shapes for shape in shapes)
        if not shapes or not known:
            raise ValueError(f"{where}.shapes: expected a non-empty list of {sorted(known_shapes)}, got {shapes!r}")
        variants = item["variants"]
        if not isinstance(variants, list) or not all(isinstance(v, dict) and v for v in variants):
            raise ValueError(f"{where}.variants: expected a list of non-empty config objects, got {variants!r}")
        jobs.append(Job(item["entry"], item["kernel"], tuple(shapes), tuple(dict(v) for v in variants)))
    return jobs


def overlay(stored: dict[str, Any], variant: dict[str, Any]) -> dict[str, Any]:
    """The stored config with the variant's keys; an "indexing" string sets every load's indexing."""
    config = dict(stored)
    for key, value in variant.items():
        if key == "indexing" and isinstance(value, str):
            value = [value] * len(stored.get("indexing", []))
        config[key] = value
    return config


def label(variant: dict[str, Any]) -> str:
    return json.dumps(variant, separators=(",", ":"), sort_keys=True) if variant else STORED


def max_rel_diff(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The largest |a - b| over max |b|, across outputs."""
    pairs = zip(outputs, reference, strict=True)
    return max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in pairs)


def _public_outputs(entry: Any, inputs: dict[str, Any]) -> list[torch.Tensor]:
    return [t.double().clone() for t in entry.run_helion(inputs).values() if isinstance(t, torch.Tensor)]


def sweep_shape(job: Job, shape_name: str, device: str, timer: Any, rounds: int, precision: bool) -> dict[str, Any]:
    """One job at one shape: each variant's config, validity, precision against the stored config and, with a
    timer, the median milliseconds of everything timed."""
    entry = registry.get(job.entry)
    inputs = entry.inputs(suites.load().shape(shape_name), 0, device)
    with capture_launches() as launches:
        entry.run_helion(inputs)
    found = next(((tk, args) for tk, args in launches if tk.name == job.kernel), None)
    if found is None:
        names = sorted({tk.name for tk, _ in launches})
        raise ValueError(f"kernel: {job.entry} launches {names}, not {job.kernel!r}")
    kernel, args = found
    key = kernel.shape_key(*args)
    stored = kernel.lookup(*args)
    stored_config = stored.config
    if stored_config is None:
        stored_config = dict(kernel.bound(args).config_spec.default_config())
    stored_config = complete_config(kernel, args, stored_config, stored.source != "exact") or dict(stored_config)
    reference = _public_outputs(entry, inputs) if precision else []
    timed = {"mamba_ssm": entry.bind(entry.baseline_fn(), inputs), "ours": entry.bind(entry.helion_fn(), inputs)}
    variants = []
    for variant in ({}, *job.variants):
        config = overlay(stored_config, variant)
        record: dict[str, Any] = {"variant": label(variant), "config": config}
        variants.append(record)
        why = validate_config(kernel, args, config)
        if why is not None:
            record["invalid"] = why
            continue
        compiled = kernel.helion_kernel(config)
        try:
            compiled(*args)
            if precision and variant:
                with pinned_config(kernel, config, key):
                    record["max_rel_diff_vs_stored"] = max_rel_diff(_public_outputs(entry, inputs), reference)
        except Exception as exc:  # a config that fails to compile or launch is a result, not the end of the sweep
            record["failed"] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        timed["kernel " + record["variant"]] = lambda compiled=compiled: compiled(*args)
    medians = None
    if timer is not None:
        medians = {name: statistics.median(s) for name, s in timer.interleaved(timed, rounds=rounds).items()}
        for record in variants:
            record["median_ms"] = medians.get("kernel " + record["variant"])
    return {"entry": job.entry, "kernel": job.kernel, "shape": shape_name, "key": str(key), "medians_ms": medians,
            "variants": variants}


def report(result: dict[str, Any]) -> str:
    """A result as lines: the public calls' ratio, then the variants fastest first."""
    head = f"== {result['entry']} / {result['kernel']} @ {result['shape']}"
    medians = result["medians_ms"]
    if medians:
        head += (f": mamba-ssm {medians['mamba_ssm']:.4f} ms, ours {medians['ours']:.4f} ms "
                 f"({medians['mamba_ssm'] / medians['ours']:.3f}x)")
    lines = [head]
    stored_ms = next(r.get("median_ms") for r in result["variants"] if r["variant"] == STORED)
    for record in sorted(result["variants"], key=lambda r: r.get("median_ms") or float("inf")):
        ms = record.get("median_ms")
        timing = f"{ms:.4f} ms ({stored_ms / ms:.3f}x of stored)" if ms and stored_ms else "untimed"
        notes = [f"{k} {record[k]:.2e}" if k.startswith("max_") else f"{k}: {record[k]}"
                 for k in ("max_rel_diff_vs_stored", "invalid", "failed") if k in record]
        lines.append(f"   {timing}  {record['variant']}  {'; '.join(notes)}".rstrip())
    return "\n".join(lines)


def run(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        jobs = parse_spec(load_json(opts.spec))
    except OSError as exc:
        parser.error(f"{opts.spec}: {exc.strerror}")
    except UnreadableFile as exc:  # names the file itself
        parser.error(str(exc))
    except ValueError as exc:  # JSON, UTF-8 and the spec's own errors
        parser.error(f"{opts.spec}: {exc}")
    timer = None
    if opts.device == "cuda":
        from mamba2_guard.bench.timing import Timer

        timer = Timer()
    else:
        from mamba2_kernels import testing

        testing.enable_cpu_interpret()
    results = []
    for job in jobs:
        for shape_name in job.shapes:
            try:
                results.append(sweep_shape(job, shape_name, opts.device, timer, opts.rounds, not opts.no_precision))
            except ValueError as exc:
                parser.error(f"{job.entry}: {exc}")
            print(report(results[-1]), flush=True)
            atomic_write(opts.out, json.dumps(results, indent=1))  # a kill mid-write keeps the shapes before
    return 0

