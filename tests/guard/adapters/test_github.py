"""PrClient against the fake GitHub REST server: request shapes and PR life-cycle decisions."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from mamba2_guard.adapters.github import GitHubError, PrClient
from mamba2_guard.core.fingerprint_hash import fingerprint_hash
from mamba2_guard.core.prbody import branch_name, marker
from tests.guard.fake_github import FULL
from tests.guard.pr_data import FP_NEW, FP_OLD

SLUG = "nvidia-h200"
FPH = fingerprint_hash(FP_NEW)
OLD_FPH = fingerprint_hash(FP_OLD)
BRANCH = branch_name(SLUG, FPH)
OLD_BRANCH = branch_name(SLUG, OLD_FPH)
LABELS = ["mamba2-guard", "performance"]


def body(fph=FPH, slug=SLUG, text="tables"):
    return f"{marker(slug, fph)}\n{text}\n"


def open_pr(client, **kw):
    args = dict(
        repo_full_name=FULL,
        branch=BRANCH,
        base="main",
        title="mamba2-guard: re-tuned",
        body=body(),
        labels=LABELS,
        gpu_slug=SLUG,
        fingerprint_hash=FPH,
    )
    args.update(kw)
    return client.open_or_update_pr(**args)


def test_first_pr_is_created_with_labels(client, fake_gh):
    out = open_pr(client)
    assert out.action == "created" and out.number == 1 and out.url.endswith(f"/{FULL}/pull/1")
    assert out.superseded == () and not out.reopened
    seq = [(r.method, r.path.split("/api/v3")[1]) for r in fake_gh.requests]
    assert seq == [
        ("GET", f"/repos/{FULL}"),
        ("GET", f"/repos/{FULL}/pulls"),
        ("POST", f"/repos/{FULL}/pulls"),
        ("POST", f"/repos/{FULL}/issues/1/labels"),
        ("GET", f"/repos/{FULL}/pulls"),
    ]
    lookup, create, labels, listing = fake_gh.requests[1:]
    assert lookup.query["state"] == "all" and lookup.query["head"] == f"octo:{BRANCH}"
    assert create.json == {"title": "mamba2-guard: re-tuned", "head": BRANCH, "base": "main", "body": body()}
    assert labels.json == LABELS  # PyGithub sends a bare array; GitHub accepts it
    assert listing.query == {"state": "open", "base": "main", "per_page": "100"}
    pr = fake_gh.state.pulls[1]
    assert pr["labels"] == LABELS and pr["body"].startswith(marker(SLUG, FPH))
    assert all(r.headers["authorization"] == f"token {fake_gh.token}" for r in fake_gh.requests)


def test_marker_is_added_when_the_body_lacks_it(client, fake_gh):
    open_pr(client, body="no marker here")
    assert fake_gh.state.pulls[1]["body"] == f"{marker(SLUG, FPH)}\nno marker here"


def test_open_pr_is_updated_in_place_never_duplicated(client, fake_gh):
    n = fake_gh.add_pr(BRANCH, title="old title", body=body(text="old"), labels=["mamba2-guard", "keep-me"])
    out = open_pr(client, title="new title", body=body(text="new"))
    assert out.action == "updated" and out.number == n
    assert not fake_gh.calls("POST", r"/pulls$")
    (patch,) = fake_gh.calls("PATCH")
    assert patch.json == {"title": "new title", "body": body(text="new")}
    (lab,) = fake_gh.calls("POST", r"/labels$")
    assert lab.json == ["performance"]  # only the missing one; human labels stay
    assert fake_gh.state.pulls[n]["labels"] == ["mamba2-guard", "keep-me", "performance"]
    assert len(fake_gh.state.pulls) == 1
    # Same content again: nothing written.
    writes = len(fake_gh.writes())
    again = open_pr(client, title="new title", body=body(text="new"))
    assert again.action == "noop" and again.number == n and len(fake_gh.writes()) == writes


def test_older_prs_for_the_same_gpu_are_superseded(client, fake_gh):
    old_marker = fake_gh.add_pr(OLD_BRANCH, body=body(OLD_FPH))
    old_prefix = fake_gh.add_pr(f"mamba2-guard/{SLUG}/deadbeef0000", body="hand-written, no marker")
    other_gpu = fake_gh.add_pr(branch_name("nvidia-a100", "f" * 64), body=body("f" * 64, "nvidia-a100"))
    similar_slug = fake_gh.add_pr(f"mamba2-guard/{SLUG}-nvl/0123456789ab", body="")
    human = fake_gh.add_pr("feature/x", body="unrelated")
    other_base = fake_gh.add_pr(f"mamba2-guard/{SLUG}/aaaaaaaaaaaa", base="release", body=body("a" * 64))
    out = open_pr(client)
    assert out.action == "created"
    assert out.superseded == (old_marker, old_prefix)
    st = fake_gh.state.pulls
    for n in (old_marker, old_prefix):
        assert st[n]["state"] == "closed"
        (comment,) = fake_gh.state.comments[n]
        assert f"Superseded by #{out.number}" in comment["body"] and out.url in comment["body"]
        assert f"mamba2-guard:superseded-by=#{out.number}" in st[n]["body"]
    for n in (other_gpu, similar_slug, human, other_base):
        assert st[n]["state"] == "open" and fake_gh.state.comments[n] == []


def test_closed_unmerged_is_respected_unless_forced(client, fake_gh):
    n = fake_gh.add_pr(BRANCH, body=body(), state="closed")
    out = open_pr(client)
    assert out.action == "skipped-closed" and out.number == n and "closed without merging" in out.detail
    assert fake_gh.writes() == []
    forced = open_pr(client, force=True, title="again")
    assert forced.action == "updated" and forced.reopened and forced.number == n
    (patch,) = fake_gh.calls("PATCH")
    assert patch.json["state"] == "open" and patch.json["title"] == "again"
    assert fake_gh.state.pulls[n]["state"] == "open" and len(fake_gh.state.pulls) == 1


def test_force_opens_a_new_pr_when_github_refuses_to_reopen(client, fake_gh):
    n = fake_gh.add_pr(BRANCH, body=body(), state="closed")
    fake_gh.state.refuse_reopen = True
    out = open_pr(client, force=True)
    assert out.action == "created" and out.number != n and not out.reopened
    assert fake_gh.state.pulls[n]["state"] == "closed"


def test_merged_or_bot_closed_prs_do_not_block_a_new_one(client, fake_gh):
    fake_gh.add_pr(BRANCH, body=body(), state="closed", merged=True)
    fake_gh.add_pr(BRANCH, body=body() + "<!-- mamba2-guard:superseded-by=#9 -->", state="closed")
    out = open_pr(client)
    assert out.action == "created" and out.number == 3


def test_human_edit_comment_once_per_head(client, fake_gh):
    n = fake_gh.add_pr(BRANCH, body=body())
    out = client.comment_human_edit(FULL, BRANCH, head_sha="a" * 40, authors=["alice@example.com"])
    assert out.action == "commented" and out.number == n
    (c,) = fake_gh.state.comments[n]
    assert "alice@example.com" in c["body"] and "will not force-push" in c["body"]
    again = client.comment_human_edit(FULL, BRANCH, head_sha="a" * 40, authors=["alice@example.com"])
    assert again.action == "noop" and len(fake_gh.state.comments[n]) == 1
    newer = client.comment_human_edit(FULL, BRANCH, head_sha="b" * 40)
    assert newer.action == "commented" and len(fake_gh.state.comments[n]) == 2
    assert not fake_gh.calls("PATCH")
    assert client.comment_human_edit(FULL, "mamba2-guard/none/000000000000").action == "noop"


def test_bad_token_and_missing_token(fake_gh, monkeypatch):
    monkeypatch.setenv("OTHER_TOKEN", "ghp_wrongWRONGwrong123456")
    c = PrClient(
        token_env="OTHER_TOKEN",
        base_url=fake_gh.api,
        retry=None,
        seconds_between_requests=None,
        seconds_between_writes=None,
    )
    with pytest.raises(GitHubError) as ei:
        open_pr(c)
    assert ei.value.status == 401 and "Bad credentials" in str(ei.value)
    assert "ghp_wrongWRONGwrong123456" not in str(ei.value)
    assert fake_gh.violations and "Authorization" in fake_gh.violations[0]
    fake_gh.violations.clear()
    monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
    with pytest.raises(GitHubError, match=r"\$NO_SUCH_TOKEN"):
        PrClient(token_env="NO_SUCH_TOKEN", base_url=fake_gh.api)


@pytest.mark.parametrize("status,headers", [
    (403, {"X-RateLimit-Remaining": "0",
           "X-RateLimit-Reset": str(int(datetime(2026, 12, 6, 3, 0, tzinfo=timezone.utc).timestamp()))}),
    (429, {"Retry-After": "3600"}),
], ids=["403-remaining-0", "429-retry-after"])
def test_a_rate_limit_is_one_line_at_once_not_an_hour_of_sleep(client, fake_gh, status, headers):
    fake_gh.answer = (status, b'{"message": "API rate limit exceeded"}', headers)
    t0 = time.monotonic()
    with pytest.raises(GitHubError) as caught:
        client.open_or_update_pr(FULL, BRANCH, "main", "t", "b", [], "h200", "a" * 64)
    assert time.monotonic() - t0 < 10
    message = str(caught.value)
    assert f"GitHub ({fake_gh.api})" in message and "rate limit reached" in message and "\n" not in message
    assert "resets at " in message and "next run" in message
    if status == 403:
        assert "2026-12-06 03:00 UTC" in message


@pytest.mark.parametrize("body", [b'[{"id": 1}]', b"<html>proxy error</html>"], ids=["json-list", "garbage"])
def test_an_odd_response_is_one_line_naming_github_and_the_url(client, fake_gh, body):
    fake_gh.answer = (200, body, {})
    with pytest.raises(GitHubError) as caught:
        client.open_or_update_pr(FULL, BRANCH, "main", "t", "b", [], "h200", "a" * 64)
    assert str(caught.value).startswith(f"GitHub ({fake_gh.api}): ") and "\n" not in str(caught.value)
