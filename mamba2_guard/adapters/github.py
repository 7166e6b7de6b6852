"""GitHub side of the config-update PR (PyGithub; ``base_url`` configurable for GitHub Enterprise).

One PR per GPU and environment fingerprint, found by its deterministic branch and the hidden marker
``<!-- mamba2-guard:gpu=<slug> fingerprint=<hash> -->``:

- an open PR for the branch is updated in place (title, body, base, missing labels), never duplicated;
- older open PRs for the same GPU (marker or ``mamba2-guard/<slug>/`` branch) are closed with a comment
  linking the new one (their branches are left alone);
- a PR for the branch that a human closed without merging is respected: no new PR, no reopen, unless
  ``force``; PRs the bot itself closed as superseded do not count as a human "no";
- human commits on the branch get one comment (per head commit), never a force-push.

The token comes from an environment variable and is scrubbed from every message (``gitops.redact``).

Every call ends in bounded time: server errors are retried three times with a short backoff, and a rate limit
is not waited out (PyGithub's own retry sleeps until its reset, up to an hour, while the nightly waits) but
raised at once, naming the reset time; the next run tries again. Whatever goes wrong, the error is one line
that names GitHub and the API's URL.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from github import Auth, Github, GithubException
from urllib3.util import Retry

from mamba2_guard.adapters.gitops import DEFAULT_TOKEN_ENV, install_log_redaction, redact, register_secret
from mamba2_guard.core.prbody import branch_prefix, marker, parse_marker, sanitize_slug

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.github.com"
SUPERSEDED_RE = re.compile(r"<!--\s*mamba2-guard:superseded-by=#?(\d+)\s*-->")
HUMAN_EDIT_MARKER = "<!-- mamba2-guard:human-edit head={sha} -->"

CREATED = "created"
UPDATED = "updated"
NOOP = "noop"
SKIPPED_CLOSED = "skipped-closed"
COMMENTED = "commented"
CLOSED = "closed"


class GitHubError(RuntimeError):
    """A GitHub API call failed; the message is redacted."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(redact(message))
        self.status = status


@dataclass(frozen=True)
class PrOutcome:
    """What ``open_or_update_pr`` (or a sibling) did.

    action: created | updated | noop | skipped-closed | commented | closed.
    """

    action: str
    number: int | None = None
    url: str | None = None
    superseded: tuple[int, ...] = ()
    reopened: bool = False
    detail: str = ""


def bounded_retry() -> Retry:
    """Three retries of a server error, backing off 1-4 s; no wait for a rate limit (module docstring)."""
    return Retry(total=3, backoff_factor=1, status_forcelist=(500, 502, 503, 504), allowed_methods=None,
                 respect_retry_after_header=False, raise_on_status=False)


def rate_limit_reset(status: int | None, headers: Any, now: datetime.datetime | None = None
                     ) -> datetime.datetime | None:
    """When a rate-limited response's limit resets (``X-RateLimit-Reset``, else ``Retry-After``), or None
    when the response is no rate limit."""
    fields = {str(k).lower(): str(v) for k, v in (headers or {}).items()}
    limited = fields.get("x-ratelimit-remaining") == "0" or "retry-after" in fields
    if status not in (403, 429) or not limited:
        return None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if fields.get("x-ratelimit-reset", "").isdigit():
        return datetime.datetime.fromtimestamp(int(fields["x-ratelimit-reset"]), datetime.timezone.utc)
    if fields.get("retry-after", "").isdigit():
        return now + datetime.timedelta(seconds=int(fields["retry-after"]))
    return now


def _err(what: str, e: GithubException) -> GitHubError:
    reset = rate_limit_reset(e.status, e.headers)
    if reset is not None:
        return GitHubError(f"{what}: rate limit reached (HTTP {e.status}); it resets at {reset:%Y-%m-%d %H:%M} UTC; "
                           "the PR step gives up now and tries again on the next run", status=e.status)
    data = e.data if isinstance(e.data, dict) else {}
    msg = data.get("message") or str(e.data or "")
    errors = data.get("errors")
    extra = f" ({errors})" if errors else ""
    return GitHubError(f"{what}: HTTP {e.status} {msg}{extra}", status=e.status)


Method = TypeVar("Method", bound=Callable[..., Any])


def _answers(method: Method) -> Method:
    """A public ``PrClient`` call whose every failure is one ``GitHubError`` naming GitHub and the API URL: a
    response of an unexpected shape (a list for an object, garbage) included."""

    @functools.wraps(method)
    def call(self: PrClient, *args: Any, **kwargs: Any) -> Any:
        where = f"GitHub ({self.base_url})"
        try:
            return method(self, *args, **kwargs)
        except GitHubError as exc:
            raise GitHubError(f"{where}: {exc}", exc.status) from None
        except GithubException as exc:
            raise GitHubError(f"{where}: {_err(method.__name__, exc)}", exc.status) from None
        except (TypeError, KeyError, AttributeError, ValueError) as exc:
            raise GitHubError(f"{where}: unexpected response to {method.__name__} "
                              f"({type(exc).__name__}: {exc})") from None

    return call  # type: ignore[return-value]


def _label_names(pr) -> set[str]:
    return {lb.name for lb in (pr.labels or [])}


def _with_marker(body: str, gpu_slug: str, fingerprint_hash: str) -> str:
    mk = marker(gpu_slug, fingerprint_hash)
    return body if mk in (body or "") else f"{mk}\n{body or ''}"


class PrClient:
    """Finds, creates, updates, supersedes and comments on the bot's PRs."""

    def __init__(
        self,
        *,
        token_env: str = DEFAULT_TOKEN_ENV,
        base_url: str = DEFAULT_BASE_URL,
        timeout: int = 30,
        retry: Any = None,
        seconds_between_requests: float | None = 0.25,
        seconds_between_writes: float | None = 1.0,
        user_agent: str = "mamba2-guard",
        per_page: int = 100,
    ):
        install_log_redaction()
        token = os.environ.get(token_env)
        if not token:
            raise GitHubError(f"no GitHub token: set ${token_env}")
        register_secret(token)
        self.base_url = base_url.rstrip("/")
        self._gh = Github(
            auth=Auth.Token(token),
            base_url=self.base_url,
            timeout=timeout,
            retry=retry if retry is not None else bounded_retry(),
            seconds_between_requests=seconds_between_requests,
            seconds_between_writes=seconds_between_writes,
            user_agent=user_agent,
            per_page=per_page,
        )

    # -- lookups ----------------------------------------------------------------------------

    def _repo(self, full_name: str):
        try:
            return self._gh.get_repo(full_name)
        except GithubException as e:
            raise _err(f"cannot open repository {full_name}", e) from None

    @staticmethod
    def _owner(full_name: str) -> str:
        return full_name.split("/", 1)[0]

    def _branch_prs(self, repo, full_name: str, branch: str) -> list:
        try:
            prs = list(repo.get_pulls(state="all", head=f"{self._owner(full_name)}:{branch}"))
        except GithubException as e:
            raise _err(f"cannot list pull requests for {branch}", e) from None
        return sorted((p for p in prs if p.head.ref == branch), key=lambda p: p.number)

    # -- main entry -------------------------------------------------------------------------

    @_answers
    def open_or_update_pr(
        self,
        repo_full_name: str,
        branch: str,
        base: str,
        title: str,
        body: str,
        labels: Sequence[str],
        gpu_slug: str,
        fingerprint_hash: str,
        force: bool = False,
    ) -> PrOutcome:
        """Create the PR for ``branch``, or update the open one in place; supersede older ones for the GPU."""
        repo = self._repo(repo_full_name)
        body = _with_marker(body, gpu_slug, fingerprint_hash)
        labels = list(dict.fromkeys(labels or ()))
        prs = self._branch_prs(repo, repo_full_name, branch)
        open_prs = [p for p in prs if p.state == "open"]
        reopened = False
        try:
            if open_prs:
                pr = open_prs[0]
                changed = self._sync(pr, title, body, base, labels)
                action = UPDATED if changed else NOOP
            else:
                rejected = [
                    p
                    for p in prs
                    if p.state == "closed" and p.merged_at is None and not SUPERSEDED_RE.search(p.body or "")
                ]
                if rejected and not force:
                    last = rejected[-1]
                    detail = (
                        f"#{last.number} for {branch} was closed without merging; "
                        "not reopening (pass force to override)"
                    )
                    log.info("%s", detail)
                    return PrOutcome(SKIPPED_CLOSED, last.number, last.html_url, detail=detail)
                pr = None
                if rejected and force:
                    pr = self._reopen(rejected[-1], title, body, base)
                    reopened = pr is not None
                if pr is None:
                    pr = repo.create_pull(base=base, head=branch, title=title, body=body)
                    action = CREATED
                else:
                    action = UPDATED
                missing = [lb for lb in labels if lb not in _label_names(pr)]
                if missing:
                    pr.add_to_labels(*missing)
        except GithubException as e:
            raise _err(f"cannot create or update the pull request for {branch}", e) from None

        superseded = self._supersede(repo, base, gpu_slug, branch, pr, extra_open=open_prs[1:])
        detail = f"{action} #{pr.number}" + (" (reopened)" if reopened else "")
        if superseded:
            detail += "; superseded " + ", ".join(f"#{n}" for n in superseded)
        log.info("%s", detail)
        return PrOutcome(action, pr.number, pr.html_url, tuple(superseded), reopened, detail)

    def _sync(self, pr, title: str, body: str, base: str, labels: Iterable[str]) -> bool:
        edits: dict[str, str] = {}
        if pr.title != title:
            edits["title"] = title
        if (pr.body or "") != body:
            edits["body"] = body
        if pr.base.ref != base:
            edits["base"] = base
        if edits:
            pr.edit(**edits)
        missing = [lb for lb in labels if lb not in _label_names(pr)]
        if missing:
            pr.add_to_labels(*missing)
        return bool(edits or missing)

    def _reopen(self, pr, title: str, body: str, base: str):
        try:
            pr.edit(state="open", title=title, body=body, base=base)
            return pr
        except GithubException as e:
            # GitHub refuses to reopen a PR whose branch was force-pushed or recreated: open a new one.
            log.info("cannot reopen #%s (%s); opening a new pull request", pr.number, redact(e.status))
            return None

    def _supersede(self, repo, base: str, gpu_slug: str, branch: str, keep, extra_open: Sequence = ()) -> list[int]:
        gpu_slug = sanitize_slug(gpu_slug)
        prefix = branch_prefix(gpu_slug)
        try:
            candidates = list(repo.get_pulls(state="open", base=base))
        except GithubException as e:
            raise _err("cannot list open pull requests", e) from None
        by_number = {p.number: p for p in candidates}
        for p in extra_open:
            by_number.setdefault(p.number, p)
        closed = []
        for number in sorted(by_number):
            p = by_number[number]
            if number == keep.number or p.state != "open":
                continue
            mk = parse_marker(p.body)
            same_gpu = (mk is not None and mk["gpu"] == gpu_slug) or p.head.ref.startswith(prefix)
            if mk is not None and mk["gpu"] != gpu_slug:
                same_gpu = False
            if not same_gpu:
                continue
            why = "the same branch" if p.head.ref == branch else "a newer environment fingerprint"
            try:
                p.create_issue_comment(
                    f"Superseded by #{keep.number} ({keep.html_url}) for {why} on `{gpu_slug}`. "
                    f"The branch `{p.head.ref}` is left in place."
                )
                p.edit(state="closed", body=(p.body or "") + f"\n<!-- mamba2-guard:superseded-by=#{keep.number} -->")
            except GithubException as e:
                raise _err(f"cannot close superseded pull request #{number}", e) from None
            closed.append(number)
        return closed

    # -- human edits and cleanup --------------------------------------------------------------

    @_answers
    def comment_human_edit(
        self,
        repo_full_name: str,
        branch: str,
        head_sha: str | None = None,
        authors: Iterable[str] = (),
        detail: str = "",
    ) -> PrOutcome:
        """Tell the open PR for ``branch`` that the bot stopped pushing because of human commits.

        One comment per branch head (``head_sha``): repeated nightly runs do not repeat it.
        """
        repo = self._repo(repo_full_name)
        open_prs = [p for p in self._branch_prs(repo, repo_full_name, branch) if p.state == "open"]
        if not open_prs:
            return PrOutcome(NOOP, detail=f"no open pull request for {branch}")
        pr = open_prs[0]
        tag = HUMAN_EDIT_MARKER.format(sha=(head_sha or "unknown")[:40])
        try:
            if any(tag in (c.body or "") for c in pr.get_issue_comments()):
                return PrOutcome(NOOP, pr.number, pr.html_url, detail="already commented for this head")
            who = ", ".join(sorted(set(authors))) or "someone other than the bot"
            text = (
                f"{tag}\nmamba2-guard found commits by {who} on `{branch}` and will not force-push over them. "
                "The configs from the latest run were not pushed. Merge or close this PR, or delete the "
                "branch to let the bot rebuild it."
            )
            if detail:
                text += f"\n\n{redact(detail)}"
            pr.create_issue_comment(text)
        except GithubException as e:
            raise _err(f"cannot comment on #{pr.number}", e) from None
        return PrOutcome(COMMENTED, pr.number, pr.html_url, detail=f"commented on #{pr.number}")


def client_from_config(section: dict[str, Any] | None = None) -> PrClient:
    """Build a :class:`PrClient` from the guard config's ``github`` section (base_url, token_env)."""
    section = section or {}
    return PrClient(
        token_env=section.get("token_env", DEFAULT_TOKEN_ENV),
        base_url=section.get("base_url", DEFAULT_BASE_URL),
    )

