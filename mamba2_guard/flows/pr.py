"""``mamba2-guard pr``: propose this GPU's configs and baseline in a pull request.

Composition only: the files ``mamba2_kernels/configs/<slug>.yaml`` and ``baselines/<slug>.yaml`` of a checkout
(``root``), the same files on the base branch of the PR target (read from ``mamba2_guard.adapters.gitops.ConfigRepo``'s
private clone), ``mamba2_guard.core.prbody.render_pr`` for title/body/branch, ``ConfigRepo.update`` for the
branch, ``mamba2_guard.adapters.github.PrClient`` for the PR.

Targets, from the guard config: ``git.origin`` + ``git.base_branch``; on embedded defaults a bare
repository ``<state>/pr/origin.git`` created from this checkout's HEAD (base branch ``main``), so the
whole flow runs on a laptop. The GitHub step runs only with ``github.repo`` configured and its token in
the environment; otherwise it is skipped, and the outcome says so. ``dry_run`` renders the body and the
diff and pushes nothing.
"""

from __future__ import annotations

import difflib
import os
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mamba2_guard import PROJECT_ROOT
from mamba2_guard.adapters.fingerprint import HOST_SOURCES
from mamba2_guard.config import GuardConfig
from mamba2_guard.core import drift as drift_mod
from mamba2_guard.core.configdiff import diff_config_files
from mamba2_guard.core.prbody import PrInput, render_pr

DEFAULT_BASE_BRANCH = "main"
DEFAULT_LABELS = ("mamba2-guard",)
Progress = Callable[[str], None]


@dataclass
class PrFlowOutcome:
    gpu_slug: str
    title: str
    body: str
    branch: str
    fingerprint_hash: str
    diff: str
    config_diff: str
    dry_run: bool
    origin: str
    base_branch: str
    git: dict[str, Any] | None = None
    github: dict[str, Any] | None = None
    messages: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _git(args: list[str], cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def default_origin(state_dir: Path, base_branch: str, checkout: Path = PROJECT_ROOT) -> Path:
    """``<state>/pr/origin.git``: a bare repository holding this checkout's HEAD as ``base_branch``.

    Each step is checked, not just the first: a kill between ``git init`` and the push left a bare
    repository without ``base_branch``, and every later PR failed ("Remote branch main not found").
    """
    import git

    bare = Path(state_dir).resolve() / "pr" / "origin.git"
    repo = git.Repo.init(bare, bare=True, mkdir=True)  # a no-op on an existing repository
    if f"refs/heads/{base_branch}" not in {ref.path for ref in repo.references}:
        _git(["push", "--quiet", str(bare), f"HEAD:refs/heads/{base_branch}"], cwd=checkout)
    repo.git.symbolic_ref("HEAD", f"refs/heads/{base_branch}")
    return bare


def _git_show(spec: str, cwd: Path) -> str | None:
    """A file at a revision (``REV:PATH``), None when it is not there."""
    try:
        return _git(["show", spec], cwd=cwd)
    except RuntimeError:
        return None


def _read_doc(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    doc = yaml.safe_load(text)
    return doc if isinstance(doc, dict) else None


def _run_url() -> str | None:
    server, repo, run = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    return f"{server}/{repo}/actions/runs/{run}" if server and repo and run else None


def validate(root: Path, paths: tuple[str, str]) -> None:
    """Each file to propose parses and passes the schema its readers check (the config store's, the
    baselines'): a ValueError naming the file otherwise. A PR never carries a file the kernels or the guard
    would refuse."""
    from mamba2_guard.flows import baselines
    from mamba2_kernels import config_store

    configs, baseline = paths
    for rel, load in ((configs, config_store.load), (baseline, baselines.load)):
        if (root / rel).is_file():
            load(root / rel)


def run_pr(state_dir: Path, cfg: GuardConfig, fingerprint: dict[str, Any], gpu_slug: str, *,
           root: Path = PROJECT_ROOT, dry_run: bool = False, drift: drift_mod.DriftReport | None = None,
           reproduce_command: str | None = None, progress: Progress = lambda m: None,
           client_factory: Callable[[GuardConfig], Any] | None = None,
           bring_up: dict[str, Any] | None = None) -> PrFlowOutcome:
    from mamba2_guard.adapters.gitops import ConfigRepo, managed_paths

    root = Path(root)
    messages: list[str] = []
    base_branch = cfg.git.get("base_branch") or DEFAULT_BASE_BRANCH
    origin = cfg.git.get("origin")
    paths = managed_paths(gpu_slug)
    validate(root, paths)  # before anything is fetched, committed or pushed, under --dry-run too
    new_texts = {p: (root / p).read_text() if (root / p).is_file() else None for p in paths}
    clone = Path(state_dir) / "pr" / "repo"
    if dry_run:
        # A dry run changes nothing: no state directory, no bare repository, no fetch. It compares with the
        # PR target as last fetched, else with this checkout's HEAD.
        fetched = (clone / "clone" / ".git").exists() and bool(origin)
        old_texts = {p: _git_show(f"refs/remotes/origin/{base_branch}:{p}", clone / "clone") if fetched
                     else _git_show(f"HEAD:{p}", root) for p in paths}
        messages.append(f"compared with {f'the last fetch of {origin}' if fetched else f'HEAD of {root}'}")
        origin = origin or str(Path(state_dir).resolve() / "pr" / "origin.git")
    else:
        if not origin:
            origin = str(default_origin(Path(state_dir), base_branch))
            messages.append(f"PR target: the bare repository {origin} (no git.origin in {cfg.describe()})")
        repo = ConfigRepo(clone, origin, base_branch, bot_name=cfg.bot.get("name") or "mamba2-guard[bot]",
                          bot_email=cfg.bot.get("email") or "mamba2-guard[bot]@users.noreply.github.com",
                          token_env=cfg.git.get("token_env") or cfg.token_env)
        repo.sync()
        old_texts = {p: _git_show(f"refs/remotes/origin/{base_branch}:{p}", repo.clone_dir) for p in paths}
    configs_path, baseline_path = paths
    old_configs, new_configs = _read_doc(old_texts[configs_path]), _read_doc(new_texts[configs_path])
    old_baseline, new_baseline = _read_doc(old_texts[baseline_path]), _read_doc(new_texts[baseline_path])
    if drift is None:
        drift = drift_mod.classify(fingerprint, (old_configs or {}).get("fingerprint") if old_configs else None,
                                   (old_baseline or {}).get("fingerprint"), policy=cfg.drift_policy,
                                   host_sources=HOST_SOURCES)
    text = render_pr(PrInput(
        gpu_slug=gpu_slug, fingerprint=fingerprint, new_configs=new_configs, old_configs=old_configs,
        new_baseline=new_baseline, old_baseline=old_baseline, drift=drift,
        reproduce_command=reproduce_command or "mamba2-guard autotune && mamba2-guard pr",
        run_url=_run_url(), full_data=str(Path(state_dir) / "autotune"), bring_up=bring_up))
    diff = "".join(
        "".join(difflib.unified_diff((old_texts[p] or "").splitlines(keepends=True),
                                     (new_texts[p] or "").splitlines(keepends=True),
                                     fromfile=f"a/{p}" if old_texts[p] is not None else "/dev/null",
                                     tofile=f"b/{p}" if new_texts[p] is not None else "/dev/null"))
        for p in paths)
    outcome = PrFlowOutcome(gpu_slug=gpu_slug, title=text.title, body=text.body, branch=text.branch,
                            fingerprint_hash=text.fingerprint_hash, diff=diff,
                            config_diff=diff_config_files(old_configs, new_configs).render_text(),
                            dry_run=dry_run, origin=origin, base_branch=base_branch, messages=messages)
    if not any(new_texts.values()):
        messages.append(f"nothing to propose: neither {' nor '.join(paths)} exists under {root}")
        return outcome
    if dry_run:
        messages.append("dry run: nothing committed or pushed" if diff else
                        f"nothing to propose: {' and '.join(paths)} do not differ from the base branch")
        return outcome
    result = repo.update(root, gpu_slug, text.fingerprint_hash, trigger=drift.summary(), branch=text.branch)
    outcome.git = asdict(result)
    messages.append(f"git: {result.status}: {result.detail}")
    if result.status == "noop":
        messages.append("GitHub step skipped: nothing differs from the base branch")
        return outcome
    if not cfg.github_repo:
        messages.append(f"GitHub step skipped: no github.repo in {cfg.describe()}")
        return outcome
    if not os.environ.get(cfg.token_env):
        messages.append(f"GitHub step skipped: no token in ${cfg.token_env}")
        return outcome
    from mamba2_guard.adapters.github import client_from_config

    client = (client_factory or (lambda c: client_from_config(c.github)))(cfg)
    labels = list(cfg.github.get("labels") or DEFAULT_LABELS)
    if result.status == "human-edit":
        pr = client.comment_human_edit(cfg.github_repo, result.branch, result.remote_sha,
                                       [h.author_email for h in result.human_commits], result.detail)
    else:
        pr = client.open_or_update_pr(cfg.github_repo, result.branch, base_branch, text.title, text.body, labels,
                                      gpu_slug, text.fingerprint_hash)
    outcome.github = asdict(pr)
    messages.append(f"GitHub: {pr.detail or pr.action}" + (f" {pr.url}" if pr.url else ""))
    return outcome
