"""ConfigRepo against a real bare origin (file://): build, commit, push, no-op, human edits, failures."""

from __future__ import annotations

import base64
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from mamba2_guard.adapters.gitops import ConfigRepo, FetchFailed, GitOpsError, PushFailed, redact
from mamba2_guard.core.fingerprint_hash import fingerprint_hash
from mamba2_guard.core.prbody import branch_name
from tests.guard.pr_data import CONFIGS_OLD, FP_NEW, FP_OLD, TOKEN, baseline_doc, git, new_configs

SLUG = "h200"
FPH = fingerprint_hash(FP_NEW)
BRANCH = branch_name(SLUG, FPH)
BOT = "mamba2-guard[bot]@users.noreply.github.com"


def show(bare, ref, path):
    return yaml.safe_load(git(bare, "show", f"{ref}:{path}"))


def make_repo(tmp_path, url, **kw):
    return ConfigRepo(tmp_path / "state", url, "main", **kw)


def test_first_push_commits_only_the_two_files(tmp_path, origin, origin_url, make_source, token):
    repo = make_repo(tmp_path, origin_url)
    src = make_source(new_configs(), baseline_doc(FP_NEW, helion_ms=0.4))
    res = repo.update(src, SLUG, FPH, trigger="software: helion 1.4.0 -> 1.5.0")
    assert res.status == "pushed" and res.branch == BRANCH and not res.forced
    assert set(res.changed_files) == {"mamba2_kernels/configs/h200.yaml", "baselines/h200.yaml"}
    # The remote branch: exactly one bot commit on top of main, touching only the two files.
    assert git(origin, "rev-parse", BRANCH) == res.sha
    assert git(origin, "rev-parse", f"{BRANCH}^") == git(origin, "rev-parse", "main")
    files = git(origin, "diff", "--name-only", "main", BRANCH).splitlines()
    assert sorted(files) == ["baselines/h200.yaml", "mamba2_kernels/configs/h200.yaml"]
    assert show(origin, BRANCH, "mamba2_kernels/configs/h200.yaml") == new_configs()
    author = git(origin, "log", "-1", "--format=%an <%ae>|%cn <%ce>", BRANCH)
    assert author == f"mamba2-guard[bot] <{BOT}>|mamba2-guard[bot] <{BOT}>"
    msg = git(origin, "log", "-1", "--format=%B", BRANCH)
    assert "Trigger: software: helion 1.4.0 -> 1.5.0" in msg and f"Fingerprint: {FPH}" in msg
    # Main is untouched; the clone lives under the state dir.
    assert show(origin, "main", "mamba2_kernels/configs/h200.yaml") == CONFIGS_OLD
    assert (tmp_path / "state" / "clone" / ".git").is_dir()


def test_update_in_place_and_up_to_date(tmp_path, origin, origin_url, make_source, token):
    repo = make_repo(tmp_path, origin_url)
    first = repo.update(make_source(new_configs(8), baseline_doc(FP_NEW)), SLUG, FPH, "t1")
    # Same content again: nothing to push.
    again = repo.update(make_source(new_configs(8), baseline_doc(FP_NEW)), SLUG, FPH, "t1")
    assert again.status == "up-to-date" and git(origin, "rev-parse", BRANCH) == first.sha
    # New content for the same fingerprint: the branch is rebuilt from main (one commit), lease-forced.
    second = repo.update(make_source(new_configs(16), baseline_doc(FP_NEW)), SLUG, FPH, "t2")
    assert second.status == "pushed" and second.forced and second.remote_sha == first.sha
    assert git(origin, "rev-list", "--count", f"main..{BRANCH}") == "1"
    assert show(origin, BRANCH, "mamba2_kernels/configs/h200.yaml") == new_configs(16)
    # main moves on (a human merges something else): the bot rebases onto the new base.
    seed = tmp_path / "seed"
    (seed / "README.md").write_text("changed\n")
    git(seed, "commit", "-qam", "docs")
    git(seed, "push", "-q", "origin", "main")
    third = repo.update(make_source(new_configs(16), baseline_doc(FP_NEW)), SLUG, FPH, "t3")
    assert third.status == "pushed"
    assert git(origin, "rev-parse", f"{BRANCH}^") == git(origin, "rev-parse", "main")


def test_no_diff_is_a_noop(tmp_path, origin, origin_url, make_source, token):
    repo = make_repo(tmp_path, origin_url)
    res = repo.update(make_source(CONFIGS_OLD, baseline_doc(FP_OLD)), SLUG, FPH, "nothing")
    assert res.status == "noop" and res.sha is None and res.changed_files == ()
    assert git(origin, "branch", "--list", BRANCH) == ""
    # Only the config given, baseline absent from the source: still only compared, never deleted.
    res = repo.update(make_source(CONFIGS_OLD, None), SLUG, FPH, "nothing")
    assert res.status == "noop"
    with pytest.raises(GitOpsError, match="none of"):
        repo.update(make_source(None, None), SLUG, FPH, "nothing")


def test_human_commit_stops_the_bot(tmp_path, origin, origin_url, make_source, token):
    repo = make_repo(tmp_path, origin_url)
    first = repo.update(make_source(new_configs(8), baseline_doc(FP_NEW)), SLUG, FPH, "t1")
    # A human pushes a fix-up onto the bot branch.
    work = tmp_path / "human"
    git(tmp_path, "clone", "-q", "--branch", BRANCH, str(origin), str(work))
    (work / "NOTE.md").write_text("tweak\n")
    git(work, "add", "NOTE.md")
    git(work, "commit", "-qm", "human tweak")
    git(work, "push", "-q", "origin", BRANCH)
    human_sha = git(origin, "rev-parse", BRANCH)

    res = repo.update(make_source(new_configs(32), baseline_doc(FP_NEW)), SLUG, FPH, "t2")
    assert res.status == "human-edit" and res.sha is None
    assert [c.author_email for c in res.human_commits] == ["alice@example.com"]
    assert "not force-pushing" in res.detail
    assert git(origin, "rev-parse", BRANCH) == human_sha  # nothing overwritten
    assert first.sha in git(origin, "rev-list", BRANCH)


def test_human_rebase_of_bot_commit_counts_as_human(tmp_path, origin, origin_url, make_source, token):
    repo = make_repo(tmp_path, origin_url)
    repo.update(make_source(new_configs(8), baseline_doc(FP_NEW)), SLUG, FPH, "t1")
    work = tmp_path / "human"
    git(tmp_path, "clone", "-q", "--branch", BRANCH, str(origin), str(work))
    # Amend keeps the bot as author but makes a human the committer.
    git(work, "commit", "-q", "--amend", "-m", "reworded by a human")
    git(work, "push", "-q", "-f", "origin", BRANCH)
    res = repo.update(make_source(new_configs(32), baseline_doc(FP_NEW)), SLUG, FPH, "t2")
    assert res.status == "human-edit"
    assert res.human_commits[0].author_email == BOT and res.human_commits[0].committer_email == "alice@example.com"


def test_push_to_missing_remote_fails_clearly_and_keeps_commit(tmp_path, origin, origin_url, make_source, token):
    repo = make_repo(tmp_path, origin_url)
    prepared = repo.prepare(make_source(new_configs(8), baseline_doc(FP_NEW)), SLUG, FPH, "t1")
    assert prepared.status == "committed"
    moved = origin.with_name("moved.git")
    origin.rename(moved)
    with pytest.raises(PushFailed) as ei:
        repo.push(prepared)
    err = ei.value
    assert err.branch == BRANCH and err.sha == prepared.sha
    assert "failed" in str(err) and "kept locally" in str(err) and str(origin) in str(err)
    # Local commit intact: the branch still points at it with the new content.
    clone = tmp_path / "state" / "clone"
    assert git(clone, "rev-parse", BRANCH) == prepared.sha
    assert yaml.safe_load(git(clone, "show", f"{prepared.sha}:mamba2_kernels/configs/h200.yaml")) == new_configs(8)
    # Retry once the remote is back.
    moved.rename(origin)
    assert repo.push(prepared).status == "pushed"
    assert git(origin, "rev-parse", BRANCH) == prepared.sha


def test_rejected_non_fast_forward_push(tmp_path, origin, origin_url, make_source, token):
    repo = make_repo(tmp_path, origin_url)
    first = repo.update(make_source(new_configs(8), baseline_doc(FP_NEW)), SLUG, FPH, "t1")
    git(origin, "config", "receive.denyNonFastForwards", "true")
    prepared = repo.prepare(make_source(new_configs(16), baseline_doc(FP_NEW)), SLUG, FPH, "t2")
    assert prepared.status == "committed" and prepared.remote_sha == first.sha
    with pytest.raises(PushFailed) as ei:
        repo.push(prepared)
    assert "rejected" in str(ei.value) or "non-fast-forward" in str(ei.value)
    assert git(origin, "rev-parse", BRANCH) == first.sha
    assert git(tmp_path / "state" / "clone", "rev-parse", BRANCH) == prepared.sha


def test_lease_protects_a_concurrent_push(tmp_path, origin, origin_url, make_source, token):
    repo = make_repo(tmp_path, origin_url)
    repo.update(make_source(new_configs(8), baseline_doc(FP_NEW)), SLUG, FPH, "t1")
    prepared = repo.prepare(make_source(new_configs(16), baseline_doc(FP_NEW)), SLUG, FPH, "t2")
    # Another bot instance pushes between our fetch and our push.
    other = make_repo(tmp_path / "other", origin_url)
    other.update(make_source(new_configs(64), baseline_doc(FP_NEW)), SLUG, FPH, "t3")
    concurrent = git(origin, "rev-parse", BRANCH)
    with pytest.raises(PushFailed, match="stale info|rejected"):
        repo.push(prepared)
    assert git(origin, "rev-parse", BRANCH) == concurrent


def test_bad_origin_fails_fetch_clearly(tmp_path, token):
    repo = make_repo(tmp_path, f"file://{tmp_path}/nowhere.git")
    with pytest.raises(FetchFailed, match="cannot clone"):
        repo.sync()
    with pytest.raises(GitOpsError, match="carries credentials"):
        make_repo(tmp_path, f"https://x-access-token:{TOKEN}@github.com/o/r.git")


def test_user_checkout_is_never_touched(tmp_path, origin, origin_url, make_source, token):
    user = tmp_path / "user"
    git(tmp_path, "clone", "-q", str(origin), str(user))
    (user / "wip.txt").write_text("uncommitted\n")
    before = (git(user, "rev-parse", "HEAD"), git(user, "status", "--porcelain"), git(user, "branch", "-a"))
    src = user  # the source dir may even be the user's checkout: files are only read
    (user / "mamba2_kernels/configs/h200.yaml").write_text(yaml.safe_dump(new_configs(8)))
    status_with_change = git(user, "status", "--porcelain")
    res = make_repo(tmp_path, origin_url).update(src, SLUG, FPH, "t")
    assert res.status == "pushed"
    assert git(user, "rev-parse", "HEAD") == before[0]
    assert git(user, "status", "--porcelain") == status_with_change
    assert git(user, "branch", "-a") == before[2]


def test_redact():
    assert TOKEN not in redact(f"url https://u:{TOKEN}@h/x and {TOKEN}", secrets=[TOKEN])
    assert redact("https://user:pw@example.com/r.git") == "https://***@example.com/r.git"
    assert redact("Authorization: token abc123") == "Authorization: token ***"


class _AuthRecorder(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self):
        auth = self.headers.get("Authorization")
        type(self).seen.append(auth or "")
        self.send_response(401 if not auth else 403)
        self.send_header("WWW-Authenticate", 'Basic realm="git"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *a):
        pass


def test_token_reaches_git_only_through_askpass(tmp_path, origin_url, token, capfd, debug_logs):
    """Over http the token is sent as Basic auth via GIT_ASKPASS; it never shows up anywhere else."""
    _AuthRecorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _AuthRecorder)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/octo/configs.git"
        repo = make_repo(tmp_path, url, timeout_s=30)
        with pytest.raises(FetchFailed) as ei:
            repo.sync()
    finally:
        httpd.shutdown()
        httpd.server_close()
    expected = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert expected in _AuthRecorder.seen
    out, err = capfd.readouterr()
    texts = [str(ei.value), repr(ei.value), out, err, debug_logs.text]
    texts += [r.getMessage() for r in debug_logs.records]
    for text in texts:
        assert TOKEN not in text and expected.split()[1] not in text
    # Nothing under the state dir holds the token (no URL rewrite, no credential store).
    hits = subprocess.run(["grep", "-rl", TOKEN, str(tmp_path / "state")], capture_output=True, text=True)
    assert hits.stdout == ""


def test_a_worktree_left_locked_by_a_killed_add_does_not_break_later_prs(tmp_path, origin, origin_url, make_source,
                                                                          token):
    repo = make_repo(tmp_path, origin_url)
    first = repo.update(make_source(new_configs(8), baseline_doc(FP_NEW)), SLUG, FPH, "t1")
    assert first.status == "pushed"
    # What a kill during `git worktree add` leaves: the branch checked out in a worktree locked "initializing".
    path = repo.worktree_path(BRANCH)
    if path.exists():
        git(repo.clone_dir, "worktree", "remove", "--force", str(path))
    git(repo.clone_dir, "worktree", "add", "--lock", "--reason", "initializing", "-B", BRANCH, str(path), "HEAD")
    assert (repo.clone_dir / ".git" / "worktrees").glob("*/locked")
    again = repo.update(make_source(new_configs(16), baseline_doc(FP_NEW)), SLUG, FPH, "t2")
    assert again.status == "pushed", again.detail
    assert show(origin, BRANCH, "mamba2_kernels/configs/h200.yaml") == new_configs(16)
