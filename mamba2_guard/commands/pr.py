"""``mamba2-guard pr``: open or update this GPU's config PR."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from mamba2_guard.adapters import files
from mamba2_guard.commands import common


def register(commands) -> None:
    p = common.add_command(commands, "pr", "open or update the config PR for this GPU")
    common.guard_arguments(p)
    p.add_argument("--root", metavar="DIR", type=files.existing_directory,
                   help="checkout holding the files to propose (default: this one)")
    p.add_argument("--dry-run", action="store_true", help="print the body and the diff; push nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--repo", metavar="OWNER/NAME", help="GitHub repository (overrides github.repo)")
    p.add_argument("--origin", metavar="URL", help="git remote to push to (overrides git.origin)")
    p.add_argument("--api-url", metavar="URL", type=common.url,
                   help="GitHub REST base URL, for Enterprise (overrides github.base_url)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Open or update the config PR for this GPU (``--dry-run``: print body and diff, push nothing)."""
    from mamba2_guard import PROJECT_ROOT
    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.flows.pr import run_pr

    cfg = with_overrides(common.guard_config(args), args)
    fp = fingerprint.collect()
    here = fingerprint.gpu_slug(fp)
    gpu_slug = args.gpu_slug or here
    root = Path(args.root) if args.root else PROJECT_ROOT
    problem = gpu_slug_problem(args.gpu_slug, here, root) if args.gpu_slug else None
    if problem:
        print(f"mamba2-guard: pr: {problem}", file=sys.stderr)
        return common.EXIT_USAGE
    try:
        outcome = run_pr(Path(args.state_dir), cfg, fp.to_dict(), gpu_slug, root=root, dry_run=args.dry_run)
    except RuntimeError as exc:  # git or GitHub: a remote, never a kernel problem (exit 1 is for those)
        print(f"mamba2-guard: pr: {' '.join(str(exc).split())}", file=sys.stderr)
        return common.EXIT_USAGE
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=1, sort_keys=True, default=str))
        return common.EXIT_OK
    if args.dry_run and not outcome.diff:
        print("\n".join(outcome.messages))
        return common.EXIT_OK
    print(f"title: {outcome.title}\nbranch: {outcome.branch} -> {outcome.base_branch} of {outcome.origin}\n")
    print(outcome.body)
    print("--- diff ---")
    print(outcome.diff or "(no differences)")
    for message in outcome.messages:
        print(message)
    return common.EXIT_OK


def gpu_slug_problem(gpu_slug: str, here: str, root: Path) -> str | None:
    """Why a PR for ``--gpu-slug slug`` cannot be drafted on this machine (whose GPU is ``here``), or None. The
    PR carries this machine's fingerprint as the environment its configs were measured in: drafted for another
    GPU, or on a machine with none, it would claim a GPU that never ran them. A slug with no file to propose is a typo
    more often than a new GPU (a new GPU's bring-up writes its file first)."""
    from mamba2_kernels.suites import unknown_name

    known = sorted({p.stem for folder in (root / "mamba2_kernels" / "configs", root / "baselines")
                    for p in folder.glob("*.yaml")})
    if gpu_slug not in known:
        return (f"--gpu-slug: {unknown_name('GPU slug', gpu_slug, known).args[0]} (no config or baseline file "
                f"under {root})")
    if gpu_slug != here:
        return (f"--gpu-slug: this machine's GPU is {here}, not {gpu_slug}: a PR for {gpu_slug} is drafted on that "
                "GPU, whose fingerprint it carries")
    return None


def with_overrides(cfg, args: argparse.Namespace):
    """The guard config with the PR target given on the command line (the workflow passes its own repo)."""

    if args.repo is not None and (args.repo.count("/") != 1 or not all(args.repo.split("/"))):
        raise ValueError(f"--repo: expected OWNER/NAME, got {args.repo!r}")
    github = {**cfg.github, **({"repo": args.repo} if args.repo else {}),
              **({"base_url": args.api_url} if args.api_url else {})}
    git = {**cfg.git, **({"origin": args.origin} if args.origin else {})}
    return dataclasses.replace(cfg, github=github, git=git)
