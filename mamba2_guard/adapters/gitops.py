"""Git side of the config-update PR: a private clone, a clean worktree per branch, a bot commit, a push.

:class:`ConfigRepo` never touches the user's checkout: it keeps its own clone under ``state_dir``
(``clone/`` plus ``worktrees/<branch>``), fetches the base branch and the bot's branches from
origin, and rebuilds the deterministic branch from ``origin/<base>`` on every run, copying in only
``mamba2_kernels/configs/<slug>.yaml`` and ``baselines/<slug>.yaml``.

Credentials: the token is read from an environment variable at call time and handed to git only
through ``GIT_ASKPASS`` (a small script under the state dir that echoes an environment variable of
the git child process). It is never written to a URL, ``.git/config``, argv, a log line, an
exception or a returned object; :func:`redact` scrubs every string this module emits.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import git

from mamba2_guard.core import flags
from mamba2_guard.core.prbody import BRANCH_PREFIX, branch_name
from mamba2_kernels.files import atomic_write

log = logging.getLogger(__name__)

DEFAULT_BOT_NAME = "mamba2-guard[bot]"
DEFAULT_BOT_EMAIL = "mamba2-guard[bot]@users.noreply.github.com"
DEFAULT_TOKEN_ENV = "GITHUB_TOKEN"
DEFAULT_TOKEN_USERNAME = "x-access-token"

# Env vars that would redirect git away from our private clone (e.g. when run from a git hook).
_REDIRECTING_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")

_ASKPASS_SCRIPT = """#!/bin/sh
# mamba2-guard askpass: answers git's credential prompts from the git child's environment.
# No secret is stored in this file.
case "$1" in
  [Uu]sername*) printf '%s\\n' "${MAMBA2_GUARD_GIT_USERNAME:-x-access-token}" ;;
  *) printf '%s\\n' "${MAMBA2_GUARD_GIT_PASSWORD:-}" ;;
esac
"""

# ----------------------------------------------------------------------------------------------
# Redaction

_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()
_URL_USERINFO_RE = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s'\"]+)@")
_AUTH_HEADER_RE = re.compile(r"(?i)\b(authorization\s*[:=]\s*(?:basic|bearer|token)\s+)[^\s'\"]+")
REDACTED = "***"


def register_secret(value: str | None) -> None:
    """Remember a secret so that :func:`redact` scrubs it (and its Basic-auth encodings) everywhere."""
    if not value or len(value) < 4:
        return
    variants = {value}
    for user in (DEFAULT_TOKEN_USERNAME, "x-oauth-basic", "git", "token"):
        variants.add(base64.b64encode(f"{user}:{value}".encode()).decode())
    variants.add(base64.b64encode(f"{value}:x-oauth-basic".encode()).decode())
    with _SECRETS_LOCK:
        _SECRETS.update(variants)


def redact(value: Any, secrets: Iterable[str] = ()) -> str:
    """``str(value)`` with registered (and given) secrets, URL credentials and auth headers scrubbed."""
    text = value if isinstance(value, str) else str(value)
    with _SECRETS_LOCK:
        known = set(_SECRETS)
    known.update(s for s in secrets if s)
    for s in sorted(known, key=len, reverse=True):
        if s in text:
            text = text.replace(s, REDACTED)
    text = _URL_USERINFO_RE.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _AUTH_HEADER_RE.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return text


class RedactingFilter(logging.Filter):
    """A logging filter that scrubs secrets from records (message and args) before they are emitted."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a broken record is not ours to fix; leave it
            return True
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


_FILTER = RedactingFilter()
# Loggers that may see URLs or command lines: ours, GitPython's, PyGithub's and urllib3's.
_REDACTED_LOGGERS = (
    "mamba2_guard",
    "mamba2_guard.adapters.gitops",
    "mamba2_guard.adapters.github",
    "git",
    "git.cmd",
    "git.remote",
    "git.repo.base",
    "git.util",
    "github",
    "github.Requester",
    "github.GithubRetry",
    "urllib3",
    "urllib3.connectionpool",
)


def install_log_redaction(names: Iterable[str] = _REDACTED_LOGGERS) -> None:
    """Attach :class:`RedactingFilter` to the named loggers (idempotent)."""
    for name in names:
        lg = logging.getLogger(name)
        if _FILTER not in lg.filters:
            lg.addFilter(_FILTER)


# ----------------------------------------------------------------------------------------------
# Errors and results


class GitOpsError(RuntimeError):
    """A git operation failed; the message is already redacted."""

    def __init__(self, message: str):
        super().__init__(redact(message))


class FetchFailed(GitOpsError):
    """Cloning or fetching origin failed."""


class PushFailed(GitOpsError):
    """The push failed (unreachable remote, rejected, lease lost). The local commit is kept for a retry."""

    def __init__(self, message: str, branch: str, sha: str | None, reason: str = ""):
        super().__init__(message)
        self.branch = branch
        self.sha = sha
        self.reason = redact(reason)


@dataclass(frozen=True)
class HumanCommit:
    sha: str
    author: str
    author_email: str
    committer_email: str
    summary: str


@dataclass(frozen=True)
class GitResult:
    """What happened to one GPU's branch.

    status:
      ``noop``        the files equal those on ``origin/<base>``: nothing to propose;
      ``up-to-date``  ``origin/<branch>`` already holds exactly this content on the current base;
      ``human-edit``  ``origin/<branch>`` has commits not made by the bot: nothing pushed;
      ``committed``   a new bot commit exists locally on ``branch``, not yet pushed;
      ``pushed``      that commit is on origin.
    """

    status: str
    branch: str
    base: str
    base_sha: str | None
    sha: str | None = None
    remote_sha: str | None = None
    changed_files: tuple[str, ...] = ()
    human_commits: tuple[HumanCommit, ...] = ()
    forced: bool = False
    detail: str = ""


# ----------------------------------------------------------------------------------------------


def managed_paths(gpu_slug: str) -> tuple[str, str]:
    """The only two files the bot ever commits for a GPU."""
    if not flags.valid_gpu_slug(gpu_slug):
        raise ValueError(f"invalid GPU slug {gpu_slug!r}")
    return (f"mamba2_kernels/configs/{gpu_slug}.yaml", f"baselines/{gpu_slug}.yaml")


def _has_userinfo(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return bool(parts.scheme and (parts.username or parts.password))


def _git_reason(text: str, status: int) -> str:
    """The informative lines of git's stderr/porcelain output, on one line (already redacted input)."""
    reasons = []
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("!"):  # push --porcelain: "!<tab>src:dst<tab>[rejected] (why)"
            reasons.append(ln.split("\t")[-1])
        elif ln.startswith(("fatal:", "error:", "remote: error", "ERROR")) and "failed to push some refs" not in ln:
            reasons.append(ln)
    if not reasons:
        reasons = lines[-1:] or [f"exit status {status}"]
    msg = "; ".join(dict.fromkeys(reasons)).rstrip(".")
    if "stale info" in msg:
        msg += " (the remote branch moved since the last fetch)"
    return msg


class ConfigRepo:
    """A private clone of the configs repository, driven by a bot identity.

    Typical use::

        repo = ConfigRepo(state_dir, "https://github.com/org/mamba2-guard.git", "main")
        res = repo.update(source_dir, "h200", fingerprint_hash, trigger="software: helion 1.4 -> 1.5")
        # res.status in {"noop", "up-to-date", "human-edit", "pushed"}; PushFailed on a failed push.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        origin_url: str,
        base_branch: str = "main",
        *,
        bot_name: str = DEFAULT_BOT_NAME,
        bot_email: str = DEFAULT_BOT_EMAIL,
        token_env: str | None = DEFAULT_TOKEN_ENV,
        token_username: str = DEFAULT_TOKEN_USERNAME,
        branch_prefix: str = BRANCH_PREFIX,
        timeout_s: float = 300.0,
    ):
        install_log_redaction()
        if _has_userinfo(origin_url):
            raise GitOpsError(
                f"origin URL {redact(origin_url)} carries credentials; pass the token through "
                f"${token_env or DEFAULT_TOKEN_ENV} instead (it would otherwise be stored in .git/config)"
            )
        polluted = [k for k in _REDIRECTING_ENV if os.environ.get(k)]
        if polluted:
            raise GitOpsError(
                f"{', '.join(polluted)} set in the environment would redirect git away from the private "
                "clone (running inside a git hook?); unset them first"
            )
        self.state_dir = Path(state_dir).resolve()
        self.origin_url = origin_url
        self.base_branch = base_branch
        self.bot_name = bot_name
        self.bot_email = bot_email
        self.token_env = token_env
        self.token_username = token_username
        self.branch_prefix = branch_prefix.rstrip("/")
        self.timeout_s = timeout_s
        self.clone_dir = self.state_dir / "clone"
        self.worktrees_dir = self.state_dir / "worktrees"
        self._askpass = self.state_dir / "askpass.sh"
        self._token()  # register the secret early so that every later message is scrubbed

    # -- plumbing ---------------------------------------------------------------------------

    def _token(self) -> str | None:
        token = os.environ.get(self.token_env) if self.token_env else None
        register_secret(token)
        return token or None

    def _write_askpass(self) -> Path:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if not self._askpass.exists() or self._askpass.read_text() != _ASKPASS_SCRIPT:
            atomic_write(self._askpass, _ASKPASS_SCRIPT, mode=stat.S_IRWXU)
        return self._askpass

    def _env(self, network: bool) -> dict[str, str]:
        env = {
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": self.bot_name,
            "GIT_AUTHOR_EMAIL": self.bot_email,
            "GIT_COMMITTER_NAME": self.bot_name,
            "GIT_COMMITTER_EMAIL": self.bot_email,
        }
        if network:
            token = self._token()
            if token:
                env["GIT_ASKPASS"] = str(self._write_askpass())
                env["MAMBA2_GUARD_GIT_USERNAME"] = self.token_username
                env["MAMBA2_GUARD_GIT_PASSWORD"] = token
        return env

    def _git(self, args: list[str], cwd: Path, *, network: bool = False, check: bool = True) -> tuple[int, str, str]:
        """Run ``git <args>`` in ``cwd``; returns (status, stdout, stderr), all redacted."""
        pre = ["-c", "credential.helper=", "-c", "core.askPass="] if network and self._token() else []
        cmd = ["git", *pre, *args]
        shown = redact(" ".join(args))
        log.debug("git %s (in %s)", shown, cwd)
        try:
            status, out, err = git.Git(str(cwd)).execute(
                cmd,
                env=self._env(network),
                with_extended_output=True,
                with_exceptions=False,
                kill_after_timeout=self.timeout_s if network else None,
            )
        except git.GitCommandNotFound as e:  # pragma: no cover - environment problem
            raise GitOpsError(f"git not found: {redact(e)}") from None
        out, err = redact(out or ""), redact(err or "")
        if check and status != 0:
            raise GitOpsError(f"git {shown} failed (exit {status}): {err.strip() or out.strip()}")
        return status, out, err

    def _repo(self) -> git.Repo:
        return git.Repo(str(self.clone_dir))

    def _rev(self, ref: str) -> str | None:
        status, out, _ = self._git(
            ["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], self.clone_dir, check=False
        )
        return out.strip() if status == 0 and out.strip() else None

    def default_branch(self, gpu_slug: str, fingerprint_hash: str) -> str:
        return branch_name(gpu_slug, fingerprint_hash, prefix=self.branch_prefix)

    # -- sync -------------------------------------------------------------------------------

    def _valid_clone(self) -> bool:
        try:
            repo = self._repo()
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            return False
        return not repo.bare

    def sync(self) -> str:
        """Clone (first time) or fetch origin; returns the sha of ``origin/<base>``."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if not self._valid_clone():
            if self.clone_dir.exists():
                log.warning("removing an unusable clone at %s", self.clone_dir)
                shutil.rmtree(self.clone_dir)
            if self.worktrees_dir.exists():
                shutil.rmtree(self.worktrees_dir)
            status, out, err = self._git(
                [
                    "clone",
                    "--no-checkout",
                    "--single-branch",
                    "--branch",
                    self.base_branch,
                    self.origin_url,
                    str(self.clone_dir),
                ],
                self.state_dir,
                network=True,
                check=False,
            )
            if status != 0:
                shutil.rmtree(self.clone_dir, ignore_errors=True)
                raise FetchFailed(
                    f"cannot clone {redact(self.origin_url)} (branch {self.base_branch}): "
                    f"{_git_reason(err + chr(10) + out, status)}"
                )
        else:
            _, current, _ = self._git(["remote", "get-url", "origin"], self.clone_dir, check=False)
            if current.strip() != self.origin_url:
                self._git(["remote", "set-url", "origin", self.origin_url], self.clone_dir)
        refspecs = [
            f"+refs/heads/{self.base_branch}:refs/remotes/origin/{self.base_branch}",
            f"+refs/heads/{self.branch_prefix}/*:refs/remotes/origin/{self.branch_prefix}/*",
        ]
        status, out, err = self._git(
            ["fetch", "--prune", "--no-tags", "origin", *refspecs], self.clone_dir, network=True, check=False
        )
        if status != 0:
            raise FetchFailed(f"cannot fetch {redact(self.origin_url)}: {_git_reason(err + chr(10) + out, status)}")
        base_sha = self._rev(f"refs/remotes/origin/{self.base_branch}")
        if base_sha is None:
            raise FetchFailed(f"base branch {self.base_branch!r} not found on {redact(self.origin_url)}")
        return base_sha

    # -- inspection -------------------------------------------------------------------------

    def remote_sha(self, branch: str) -> str | None:
        return self._rev(f"refs/remotes/origin/{branch}")

    def human_commits(self, branch: str) -> list[HumanCommit]:
        """Commits on ``origin/<branch>`` (not on base) whose author or committer is not the bot.

        A committer check as well catches a human rebase or amend of a bot commit.
        """
        if self.remote_sha(branch) is None:
            return []
        repo = self._repo()
        rng = f"refs/remotes/origin/{self.base_branch}..refs/remotes/origin/{branch}"
        bot = self.bot_email.lower()
        out = []
        for c in repo.iter_commits(rng):
            a_email = (c.author.email or "").lower()
            c_email = (c.committer.email or "").lower()
            if a_email != bot or c_email != bot:
                out.append(
                    HumanCommit(
                        sha=c.hexsha,
                        author=redact(c.author.name or ""),
                        author_email=redact(c.author.email or ""),
                        committer_email=redact(c.committer.email or ""),
                        summary=redact(c.summary if isinstance(c.summary, str) else c.summary.decode()),
                    )
                )
        return out

    # -- build ------------------------------------------------------------------------------

    def worktree_path(self, branch: str) -> Path:
        return self.worktrees_dir / branch.replace("/", "__")

    def _fresh_worktree(self, branch: str) -> Path:
        path = self.worktree_path(branch)
        # A kill during `git worktree add` leaves the worktree locked ("initializing"): prune skips it, and the
        # branch stays checked out there, so every later `worktree add -B` failed. Only this guard (one cycle
        # at a time, under the state dir's lock) uses the clone, so a lock in it is always a stale one.
        for lock in (self.clone_dir / ".git" / "worktrees").glob("*/locked"):
            lock.unlink(missing_ok=True)
        self._git(["worktree", "prune"], self.clone_dir)
        _, listing, _ = self._git(["worktree", "list", "--porcelain"], self.clone_dir)
        if f"worktree {path}" in listing:
            self._git(["worktree", "remove", "--force", str(path)], self.clone_dir, check=False)
        if path.exists():
            shutil.rmtree(path)
        self._git(["worktree", "prune"], self.clone_dir)
        self.worktrees_dir.mkdir(parents=True, exist_ok=True)
        self._git(
            [
                "worktree",
                "add",
                "--force",
                "--no-track",
                "-B",
                branch,
                str(path),
                f"refs/remotes/origin/{self.base_branch}",
            ],
            self.clone_dir,
        )
        return path

    def prepare(
        self,
        source_dir: str | os.PathLike[str],
        gpu_slug: str,
        fingerprint_hash: str,
        trigger: str,
        branch: str | None = None,
        *,
        fetch: bool = True,
    ) -> GitResult:
        """Rebuild ``branch`` from ``origin/<base>`` with this GPU's two files; commit if they differ.

        Returns ``noop``, ``up-to-date``, ``human-edit`` or ``committed`` (nothing is pushed).
        """
        paths = managed_paths(gpu_slug)
        branch = branch or self.default_branch(gpu_slug, fingerprint_hash)
        if branch == self.base_branch or not branch.startswith(self.branch_prefix + "/"):
            raise GitOpsError(f"refusing to write branch {branch!r}: not under {self.branch_prefix}/")
        source = Path(source_dir)
        present = [p for p in paths if (source / p).is_file()]
        if not present:
            raise GitOpsError(f"none of {', '.join(paths)} exists under {source}")

        base_sha = self.sync() if fetch else self._rev(f"refs/remotes/origin/{self.base_branch}")
        remote_sha = self.remote_sha(branch)
        result = GitResult(
            status="noop", branch=branch, base=self.base_branch, base_sha=base_sha, remote_sha=remote_sha
        )

        humans = self.human_commits(branch)
        if humans:
            who = ", ".join(sorted({h.author_email or h.author for h in humans}))
            detail = (
                f"{len(humans)} commit(s) by someone other than the bot ({who}) on {branch}; "
                "not force-pushing over them"
            )
            log.warning("%s", detail)
            return replace(result, status="human-edit", human_commits=tuple(humans), detail=detail)

        wt = self._fresh_worktree(branch)
        for rel in present:
            dst = wt / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / rel, dst)
        self._git(["add", "--", *present], wt)
        _, names, _ = self._git(["diff", "--cached", "--name-only", "--", *present], wt)
        changed = tuple(n for n in names.splitlines() if n.strip())
        if not changed:
            detail = f"{', '.join(present)} already match origin/{self.base_branch}"
            log.info("no-op: %s", detail)
            return replace(result, detail=detail)

        message = self._message(gpu_slug, fingerprint_hash, trigger, changed)
        self._git(["-c", "commit.gpgsign=false", "commit", "--no-verify", "--quiet", "-m", message], wt)
        sha = self._rev(branch)
        result = replace(
            result,
            status="committed",
            sha=sha,
            changed_files=changed,
            detail=f"committed {', '.join(changed)} on {branch}",
        )

        if remote_sha is not None and self._same_change(remote_sha, sha, base_sha):
            log.info("%s on origin already holds this change on the current base", branch)
            return replace(result, status="up-to-date", detail=f"origin/{branch} already up to date")
        return result

    def _same_change(self, remote_sha: str, sha: str | None, base_sha: str | None) -> bool:
        repo = self._repo()
        remote = repo.commit(remote_sha)
        local = repo.commit(sha)
        return remote.tree.hexsha == local.tree.hexsha and [p.hexsha for p in remote.parents] == [base_sha]

    def _message(self, gpu_slug: str, fp_hash: str, trigger: str, changed: tuple[str, ...]) -> str:
        kinds = []
        if any(p.startswith("mamba2_kernels/configs/") for p in changed):
            kinds.append("configs")
        if any(p.startswith("baselines/") for p in changed):
            kinds.append("baseline")
        subject = f"mamba2-guard: update {gpu_slug} {' and '.join(kinds)}"
        lines = [
            subject,
            "",
            f"Trigger: {redact(trigger).strip() or 'manual'}",
            f"GPU: {gpu_slug}",
            f"Fingerprint: {fp_hash}",
            "Files:",
        ]
        lines += [f"  {p}" for p in changed]
        return "\n".join(lines) + "\n"

    # -- push -------------------------------------------------------------------------------

    def push(self, result: GitResult) -> GitResult:
        """Push a ``committed`` result with a lease on the remote sha seen at fetch time.

        Other statuses are returned unchanged (nothing to push). On failure raises
        :class:`PushFailed`; the local branch keeps the commit, so calling ``push`` again retries.
        """
        if result.status != "committed":
            return result
        if result.human_commits:  # pragma: no cover - prepare never builds a commit then
            return replace(result, status="human-edit")
        local = self._rev(result.branch)
        if local != result.sha:
            raise PushFailed(
                f"local branch {result.branch} moved ({local} != {result.sha}); prepare again",
                result.branch,
                result.sha,
            )
        lease = f"--force-with-lease=refs/heads/{result.branch}:{result.remote_sha or ''}"
        forced = result.remote_sha is not None and not self._is_ancestor(result.remote_sha, result.sha)
        status, out, err = self._git(
            ["push", "--porcelain", lease, "origin", f"{result.sha}:refs/heads/{result.branch}"],
            self.clone_dir,
            network=True,
            check=False,
        )
        if status != 0:
            reason = (err.strip() + "\n" + out.strip()).strip()
            raise PushFailed(
                f"push of {result.branch} ({result.sha[:12] if result.sha else '?'}) to "
                f"{redact(self.origin_url)} failed: {_git_reason(reason, status)}. "
                "The commit is kept locally; retry with push().",
                result.branch,
                result.sha,
                reason,
            )
        log.info("pushed %s to %s", result.branch, redact(self.origin_url))
        # Keep the remote-tracking ref in step without another fetch.
        self._git(["update-ref", f"refs/remotes/origin/{result.branch}", result.sha], self.clone_dir, check=False)
        return replace(result, status="pushed", forced=forced, detail=f"pushed {result.branch}")

    def _is_ancestor(self, a: str, b: str | None) -> bool:
        if not b:
            return False
        status, _, _ = self._git(["merge-base", "--is-ancestor", a, b], self.clone_dir, check=False)
        return status == 0

    # -- all in one -------------------------------------------------------------------------

    def update(
        self,
        source_dir: str | os.PathLike[str],
        gpu_slug: str,
        fingerprint_hash: str,
        trigger: str,
        branch: str | None = None,
    ) -> GitResult:
        """fetch -> rebuild branch -> commit -> push. Status: noop | up-to-date | human-edit | pushed."""
        return self.push(self.prepare(source_dir, gpu_slug, fingerprint_hash, trigger, branch))
