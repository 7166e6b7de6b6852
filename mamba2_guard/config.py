"""The guard's own settings: ``guard.yaml`` in the state directory, or ``--config PATH``.

Everything has a default, so no file is needed (embedded defaults)::

    drift:
      policy: {new-gpu: retune, software: {helion: retune, mamba_ssm: rebaseline}, kernel-source: retune}
    policy:                      # verdict policy (mamba2_guard.core.verdicts.Policy), e.g. threshold, overrides
      threshold: 0.05
    autotune: {effort: quick, budget_seconds: 10, total_budget_seconds: 1800, margin: 0.02, alpha: 0.01,
               rounds: 30, max_attempts: 2, seed: 1234, helion_benchmark_subprocess: false}
    github: {repo: owner/name, base_url: https://api.github.com, token_env: GITHUB_TOKEN, labels: [mamba2-guard]}
    git: {origin: https://github.com/owner/name.git, base_branch: main}
    bot: {name: "mamba2-guard[bot]", email: "mamba2-guard[bot]@users.noreply.github.com"}
    pr: {enabled: true}

Without ``git.origin`` the PR target is a bare repository in the state directory, created from this
checkout's HEAD; without ``github.repo`` (or its token) the GitHub step is skipped and says so.
Errors name the file and the key.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mamba2_guard.core import tuneplan
from mamba2_guard.core.drift import DriftPolicy
from mamba2_guard.core.tuneplan import Criteria
from mamba2_guard.core.verdicts import Policy
from mamba2_kernels.files import UnreadableFile, load_yaml

FILE_NAME = "guard.yaml"
SECTIONS = ("drift", "policy", "autotune", "github", "git", "bot", "pr")
AUTOTUNE_KEYS = {"effort": str, "budget_seconds": (int, float), "total_budget_seconds": (int, float, type(None)),
                 "margin": (int, float), "alpha": (int, float), "confidence": (int, float), "rounds": int,
                 "max_attempts": int, "seed": int, "job_timeout_seconds": (int, float, type(None)),
                 "helion_benchmark_subprocess": bool, "bringup_job_seconds": (int, float)}
GITHUB_KEYS = {"repo": (str, type(None)), "base_url": str, "token_env": str, "labels": list}
GIT_KEYS = {"origin": (str, type(None)), "base_branch": str, "token_env": (str, type(None))}
BOT_KEYS = {"name": str, "email": str}
PR_KEYS = {"enabled": bool}


class GuardConfigError(ValueError):
    """A bad guard config; the message names the file and the key."""


@dataclass(frozen=True)
class GuardConfig:
    path: Path | None = None
    drift_policy: DriftPolicy = field(default_factory=DriftPolicy)
    verdict_policy: Policy = field(default_factory=Policy)
    autotune: dict[str, Any] = field(default_factory=dict)
    github: dict[str, Any] = field(default_factory=dict)
    git: dict[str, Any] = field(default_factory=dict)
    bot: dict[str, Any] = field(default_factory=dict)
    pr: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def criteria(self) -> Criteria:
        keys = ("margin", "alpha", "confidence")
        return Criteria(**{k: float(self.autotune[k]) for k in keys if k in self.autotune})

    def autotune_value(self, key: str, default: Any) -> Any:
        return self.autotune.get(key, default)

    @property
    def pr_enabled(self) -> bool:
        return bool(self.pr.get("enabled", True))

    @property
    def github_repo(self) -> str | None:
        return self.github.get("repo") or None

    @property
    def token_env(self) -> str:
        return self.github.get("token_env") or "GITHUB_TOKEN"

    def describe(self) -> str:
        return str(self.path) if self.path else "embedded defaults"


def _section(path: Path, data: dict[str, Any], name: str, allowed: dict[str, Any]) -> dict[str, Any]:
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GuardConfigError(f"{path}: {name}: expected a mapping, got {type(value).__name__}")
    for key, item in value.items():
        if key not in allowed:
            raise GuardConfigError(f"{path}: {name}.{key}: unknown key (allowed: {', '.join(sorted(allowed))})")
        kinds = allowed[key]
        if isinstance(item, bool) and kinds in (int, (int, float)):
            raise GuardConfigError(f"{path}: {name}.{key}: expected a number, got {item!r}")
        if not isinstance(item, kinds):
            raise GuardConfigError(f"{path}: {name}.{key}: wrong type {type(item).__name__} ({item!r})")
    return dict(value)


def _check_autotune_numbers(path: Path, autotune: dict[str, Any]) -> None:
    """The numbers as the autotune and the bring-up check them when they run (``tuneplan.setting_problem``)."""
    for key in tuneplan.SETTING_RANGES:
        problem = tuneplan.setting_problem(key, autotune.get(key))
        if problem:
            raise GuardConfigError(f"{path}: autotune.{key}: {problem}")


def _check_overrides(path: Path, policy: Policy) -> None:
    """Each per-kernel override names a kernel (or a pattern matching one): a misspelt name would never apply."""
    if not policy.overrides:
        return  # the registry imports torch: a second, for a config check with nothing to look up
    from mamba2_kernels import registry
    from mamba2_kernels.suites import unknown_name

    names = list(registry.REGISTRY)
    for pattern in policy.overrides:
        if not fnmatch.filter(names, pattern):
            unknown = unknown_name("kernel", pattern, names).args[0]
            raise GuardConfigError(f"{path}: policy.overrides.{pattern}: {unknown}")


def parse(data: Any, path: Path) -> GuardConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise GuardConfigError(f"{path}: expected a mapping with keys {', '.join(SECTIONS)}")
    for key in data:
        if key not in SECTIONS:
            raise GuardConfigError(f"{path}: {key}: unknown key (allowed: {', '.join(SECTIONS)})")
    drift = data.get("drift") or {}
    if not isinstance(drift, dict):
        raise GuardConfigError(f"{path}: drift: expected a mapping")
    for key in drift:
        if key != "policy":
            raise GuardConfigError(f"{path}: drift.{key}: unknown key (allowed: policy)")
    try:
        drift_policy = DriftPolicy.from_mapping(drift.get("policy") or {})
    except ValueError as exc:
        raise GuardConfigError(f"{path}: drift.policy: {exc}") from None
    policy_raw = data.get("policy") or {}
    if not isinstance(policy_raw, dict):
        raise GuardConfigError(f"{path}: policy: expected a mapping")
    try:
        verdict_policy = Policy.from_dict(policy_raw)
    except (TypeError, ValueError) as exc:
        raise GuardConfigError(f"{path}: {exc}") from None
    _check_overrides(path, verdict_policy)
    autotune = _section(path, data, "autotune", AUTOTUNE_KEYS)
    _check_autotune_numbers(path, autotune)
    if "effort" in autotune and autotune["effort"] not in ("quick", "full"):
        raise GuardConfigError(f"{path}: autotune.effort: expected quick or full, got {autotune['effort']!r}")
    try:
        Criteria(**{k: float(autotune[k]) for k in ("margin", "alpha", "confidence") if k in autotune})
    except ValueError as exc:
        raise GuardConfigError(f"{path}: {exc}") from None
    github = _section(path, data, "github", GITHUB_KEYS)
    repo = github.get("repo")
    if repo is not None and (repo.count("/") != 1 or not all(repo.split("/"))):
        raise GuardConfigError(f"{path}: github.repo: expected owner/name, got {repo!r}")
    return GuardConfig(path=path, drift_policy=drift_policy, verdict_policy=verdict_policy, autotune=autotune,
                       github=github, git=_section(path, data, "git", GIT_KEYS),
                       bot=_section(path, data, "bot", BOT_KEYS), pr=_section(path, data, "pr", PR_KEYS),
                       raw=dict(data))


def load(explicit: str | Path | None = None, state_dir: str | Path | None = None) -> GuardConfig:
    """``explicit`` (must exist), else ``<state_dir>/guard.yaml`` if present, else the defaults."""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise GuardConfigError(f"{path}: --config: no such file")
    elif state_dir is not None and (Path(state_dir) / FILE_NAME).is_file():
        path = Path(state_dir) / FILE_NAME
    else:
        return GuardConfig()
    try:
        data = load_yaml(path)
    except UnreadableFile as exc:
        raise GuardConfigError(str(exc)) from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise GuardConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse(data, path)
