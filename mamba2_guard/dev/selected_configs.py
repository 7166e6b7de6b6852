"""``mamba2-guard dev selected``: the config each kernel launch of a whole call selects from a GPU's config
file, at each shape, without a GPU; with ``--against OLD``, the launches that select another config than they
would from ``OLD``: which baseline rows a config change leaves measured on configs that no longer run.

    mamba2-guard dev selected --suite zoo-steered --gpu-slug nvidia-h200
    git show HEAD~1:mamba2_kernels/configs/nvidia-h200.yaml > /tmp/old.yaml
    mamba2-guard dev selected --suite zoo-steered --gpu-slug nvidia-h200 --against /tmp/old.yaml

Each call runs once on CPU tensors in Helion's ref mode, at a short sequence (two chunks unless ``--seqlen``
says otherwise), to capture its launches; a launch's key then takes the shape's own token count, the only key
field the sequence length changes. The (shape, call) pairs run in parallel processes (``--processes``). Each
key selects as the runtime selects (``mamba2_kernels._runtime``): the nearest stored candidate, adapted to the call;
the state passes run fused or chained by the file's chain rule. Two selections are the same when the adapted
configs are equal. On the GPU the runtime also skips a candidate whose code does not generate under the
installed helion: only drift does that, and ``mamba2-guard drift`` reports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from mamba2_guard.adapters.state import write_json
from mamba2_kernels import config_store, registry, suites
from mamba2_kernels.ssd import forcing, fused_paths
from mamba2_kernels.tuning import capture_launches, complete_config


@dataclasses.dataclass(frozen=True)
class Selection:
    kernel: str
    key: str  # at the shape's own token count
    source: str  # "exact", "nearest", "related" or "default"
    served_by: str | None  # the stored key whose config runs
    config: dict[str, Any] | None  # adapted to the call; None: Helion's default


def at_tokens(key: config_store.ShapeKey, tokens: int) -> config_store.ShapeKey:
    """``key`` with its token count (if it has one) set to ``tokens``."""
    fields = dict(key.fields)
    return config_store.ShapeKey.of(**{**fields, "tokens": tokens}) if "tokens" in fields else key


def select(cf: config_store.ConfigFile, kernel: Any, args: tuple[Any, ...], key: config_store.ShapeKey
           ) -> Selection:
    """What the runtime runs for ``kernel`` at ``key`` from ``cf``: the first candidate, adapted to the
    captured ``args``."""
    found = config_store.find(cf, kernel.name, key)
    if found.config is None:
        return Selection(kernel.name, str(key), "default", None, None)
    config = complete_config(kernel, args, found.config, found.source != "exact") or found.config
    return Selection(kernel.name, str(key), found.source, found.key, config)


def _paths_of(cf: config_store.ConfigFile, shape: suites.ShapeSpec) -> Any:
    """The fused stages on the paths ``cf``'s rules pick for ``shape`` (on CPU the runtime reads none)."""
    paths = {stage: "chain" if fused_paths.chains_by_rule(cf, stage, shape.batch, shape.nheads, shape.headdim,
                                                          shape.dstate, shape.chunk_size) else "fused"
             for stage in (fused_paths.FWD, fused_paths.BWD)}
    paths.update({stage: "fused" if fused_paths.fuses_by_rule(cf, stage, shape.nheads // shape.ngroups) else "chain"
                  for stage in fused_paths.FUSE_STAGES})
    return forcing.forced_all(paths)


def launches(entry_name: str, shape: suites.ShapeSpec, cf: config_store.ConfigFile, seqlen: int | None = None
             ) -> list[tuple[Any, tuple[Any, ...], config_store.ShapeKey]]:
    """The distinct (kernel, args, key at the shape's tokens) that ``entry_name`` launches at ``shape``, run at
    ``seqlen`` tokens (default: two chunks)."""
    entry = registry.get(entry_name)
    short = shape.replace(seqlen=min(seqlen or 2 * shape.chunk_size, shape.seqlen))
    with _paths_of(cf, shape), capture_launches() as captured:
        entry.run_helion(entry.inputs(short, 0, "cpu"))
    tokens = config_store.tokens_bucket(shape.batch * shape.seqlen)
    out, seen = [], set()
    for kernel, args in captured:
        key = at_tokens(kernel.shape_key(*args), tokens)
        if (kernel.name, key) not in seen:
            seen.add((kernel.name, key))
            out.append((kernel, args, key))
    return out


def _line(now: Selection, before: Selection | None) -> str:
    line = f"  {now.kernel:<32} {now.source:<8} {now.served_by or '(Helion default)'}"
    if before is not None:
        line += "  same" if before.config == now.config else f"  OTHER than before: {before.served_by}"
    return line


def selections(entry_name: str, shape: suites.ShapeSpec, current: config_store.ConfigFile,
               before: config_store.ConfigFile | None, seqlen: int | None
               ) -> list[tuple[Selection, Selection | None]]:
    """Each launch of ``entry_name`` at ``shape``: its selection from ``current`` and from ``before``. In a pool
    process too, which inherits the execution mode through the environment (CPU tensors: Helion's ref mode, or
    Triton's interpreter under ``TRITON_INTERPRET``, whose patches a spawned process must apply again)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        from mamba2_kernels.testing import enable_cpu_interpret

        enable_cpu_interpret()
    return [(select(current, kernel, call_args, key),
             select(before, kernel, call_args, key) if before is not None else None)
            for kernel, call_args, key in launches(entry_name, shape, current, seqlen)]


def compare(shapes: list[suites.ShapeSpec], entries: list[str], current: config_store.ConfigFile,
            before: config_store.ConfigFile | None, seqlen: int | None = None, processes: int = 1
            ) -> tuple[dict[str, dict[str, list[dict[str, Any]]]], dict[str, list[str]]]:
    """Each launch's selection from ``current`` (and from ``before``), printed per shape and entry; returns them
    by shape and entry, and per shape the launches (``entry: kernel``) whose config differs from ``before``.
    With ``processes`` > 1 the (shape, entry) pairs run in that many spawned processes."""
    jobs = [(entry_name, shape, current, before, seqlen) for shape in shapes for entry_name in entries]
    if processes > 1 and len(jobs) > 1:
        from mamba2_guard.flows.selection_measure import in_parallel

        results = in_parallel(selections, jobs, min(processes, len(jobs)))
    else:
        results = (selections(*job) for job in jobs)
    report: dict[str, dict[str, list[dict[str, Any]]]] = {}
    changed: dict[str, list[str]] = {}
    for (entry_name, shape, *_), pairs in zip(jobs, results, strict=True):
        if isinstance(pairs, str):  # a pool process's exception, as in_parallel reports it
            raise RuntimeError(f"{entry_name} at {shape.name}: {pairs}")
        print(f"== {entry_name} at {shape.name}", flush=True)
        rows = []
        for now, then in pairs:
            print(_line(now, then))
            if then is not None and then.config != now.config:
                changed.setdefault(shape.name, []).append(f"{entry_name}: {now.kernel}")
            rows.append({"now": dataclasses.asdict(now), "before": then and dataclasses.asdict(then)})
        report.setdefault(shape.name, {})[entry_name] = rows
    return report, changed


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    for name in args.entries:
        registry.get(name)  # an unknown name is one line, exit 2
    loaded = suites.load()
    shapes = [loaded.shape(name) for name in args.shapes] if args.shapes else loaded.suite(args.suite)
    current_path = config_store.path_for(args.gpu_slug)
    if not current_path.is_file():
        parser.error(f"--gpu-slug: expected a GPU with a config file, found no {current_path}")
    if args.against is not None and not args.against.is_file():
        parser.error(f"--against: expected a config file, got {args.against}")
    current = config_store.load(current_path)
    before = config_store.load(args.against) if args.against is not None else None
    if before is not None and before.selection != current.selection:
        print(f"the selection rules differ from {args.against}: {before.selection} -> {current.selection}")
    report, changed = compare(shapes, args.entries, current, before, args.seqlen, args.processes)
    if before is not None:
        print("launches that select another config than before:" if changed else "every launch selects as before")
        for name, which in changed.items():
            print(f"  {name}: {', '.join(which)}")
    if args.out:
        write_json(args.out, {"gpu_slug": args.gpu_slug, "against": str(args.against or ""), "shapes": report})
        print(f"wrote {args.out}")
    return 0
