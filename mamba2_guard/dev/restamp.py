"""``mamba2-guard dev restamp``: record the current kernel sources in a GPU's committed config file and baseline.

Run it after the configs of the changed kernels were re-validated (re-tuned, or checked by a bench on that
GPU): it stamps only the source files of the kernels named, so that a kernel whose source changed and was not
re-validated still shows as drift. ``tests/guard/test_source_stamps.py`` fails while a committed
file's recorded sources differ from the checkout's.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import yaml

from mamba2_guard.adapters.fingerprint import KERNELS_DIR, kernel_source_hashes, restamped
from mamba2_guard.flows import baselines
from mamba2_kernels import config_store, registry
from mamba2_kernels.files import atomic_write


def kernel_files(names: list[str]) -> list[str]:
    """The source files (under mamba2_kernels/) of the named kernels' Helion implementations."""
    files = []
    for entry in registry.select(names):
        if entry.has_helion:
            origin = importlib.util.find_spec(entry.helion.partition(":")[0]).origin
            files.append(str(Path(origin).resolve().relative_to(KERNELS_DIR.resolve())))
    return sorted(set(files))


def run(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not opts.all and not opts.kernels:
        parser.error("name the re-validated kernels (--kernels K ...) or give --all")
    files = None if opts.all else kernel_files(opts.kernels)
    root = Path(opts.root)
    configs = config_store.path_for(opts.gpu_slug, root / "mamba2_kernels" / "configs")
    baseline = baselines.path_for(opts.gpu_slug, root / "baselines")
    if not configs.exists():
        parser.error(f"--gpu-slug: no config file {configs}")
    with config_store.writing(configs):
        cf = config_store.load(configs)
        cf.fingerprint = restamped(cf.fingerprint, files)
        config_store.save(configs, cf)
    print(f"stamped {configs}")
    doc = baselines.read_document(baseline)
    if doc and doc.get("fingerprint"):
        doc["fingerprint"] = restamped(doc["fingerprint"], files)
        atomic_write(baseline, yaml.safe_dump(doc, sort_keys=True, default_flow_style=False, width=120))
        print(f"stamped {baseline}")
    stale = sorted(k for k, v in kernel_source_hashes().items() if cf.fingerprint["kernel_sources"].get(k) != v)
    print("files: " + (", ".join(files) if files is not None else "all") +
          (f"; still not stamped: {', '.join(stale)}" if stale else ""))
    print("then regenerate the results page: python docs/results/build.py")
    return 0
