"""``mamba2-guard drift``: what changed since this GPU's configs and baseline were recorded."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mamba2_guard.adapters import files
from mamba2_guard.commands import common


def register(commands) -> None:
    p = common.add_command(commands, "drift",
                           "what changed since the configs and baseline were recorded (exit 1: drift)")
    common.guard_arguments(p)
    p.add_argument("--root", metavar="DIR", type=files.existing_directory,
                   help="checkout holding mamba2_kernels/configs and baselines (default: this one)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The current fingerprint against the ones recorded with the configs and the baseline. Exit 1 when
    drift that calls for an action (re-tune or re-baseline, by the guard config's policy) is found."""
    import dataclasses

    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.flows.nightly import detect_drift, recorded_paths

    cfg = common.guard_config(args)
    fp = fingerprint.collect()
    gpu_slug = args.gpu_slug or fingerprint.gpu_slug(fp)
    root = Path(args.root) if args.root else None
    report = detect_drift(fp, policy=cfg.drift_policy, root=root, gpu_slug=gpu_slug)
    report = dataclasses.replace(report, notes=report.notes + (
        "stored configs are checked against the installed helion when kernels run (bench, nightly)",))
    configs_path, baseline_path = recorded_paths(gpu_slug, root)
    if args.json:
        doc = {"gpu_slug": gpu_slug, "fingerprint_digest": fp.digest(), "configs": str(configs_path),
               "baseline": str(baseline_path), "config": cfg.describe(), "policy": cfg.drift_policy.to_dict(),
               "summary": report.summary(), **report.to_dict()}
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print(f"configs: {configs_path}{'' if configs_path.exists() else ' (none)'}")
        print(f"baseline: {baseline_path}{'' if baseline_path.exists() else ' (none)'}")
        print(report.render_text())
        if report.found:
            print(f"action: {report.action} ({report.summary()})")
    return common.EXIT_FAIL if report.found else common.EXIT_OK
