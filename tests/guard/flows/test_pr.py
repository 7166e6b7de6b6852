"""The whole PR path (drift -> body -> git -> GitHub), and the token never leaking anywhere."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mamba2_guard.adapters.github import GitHubError
from mamba2_guard.adapters.gitops import ConfigRepo, FetchFailed, PushFailed
from mamba2_guard.core.drift import classify
from mamba2_guard.core.prbody import PrInput, render_pr
from tests.guard.fake_github import FULL
from tests.guard.pr_data import CONFIGS_OLD, FP_NEW, FP_OLD, TOKEN, baseline_doc, git, new_configs


def _pr_text(configs):
    drift = classify(FP_NEW, FP_OLD, FP_OLD, {})
    return drift, render_pr(
        PrInput(
            gpu_slug="h200",
            fingerprint=FP_NEW,
            new_configs=configs,
            old_configs=CONFIGS_OLD,
            new_baseline=baseline_doc(FP_NEW, helion_ms=0.4),
            old_baseline=baseline_doc(FP_OLD),
            drift=drift,
            reproduce_command="mamba2-guard nightly --gpu h200",
            run_url="https://ci.example/runs/1",
        )
    )


def test_nightly_pr_flow_and_no_token_leak(
    tmp_path, origin, origin_url, make_source, client, fake_gh, capfd, debug_logs
):
    keep: list = []  # every returned object and exception, checked for the token at the end
    repo = ConfigRepo(tmp_path / "state", origin_url, "main")

    def night(num_warps: int):
        """One night's tuning result: its PR text, then the push and the PR call."""
        drift, text = _pr_text(new_configs(num_warps))
        res = repo.update(make_source(new_configs(num_warps), baseline_doc(FP_NEW, 0.4)), "h200",
                          text.fingerprint_hash, trigger=drift.summary(), branch=text.branch)
        out = client.open_or_update_pr(FULL, res.branch, "main", text.title, text.body, ["mamba2-guard"], "h200",
                                       text.fingerprint_hash)
        return drift, text, res, out

    # Night 1: drift -> commit -> push -> PR created.
    drift, text, res, out = night(8)
    keep += [res, out, text, drift.to_dict()]
    assert res.status == "pushed" and out.action == "created"
    assert fake_gh.state.pulls[out.number]["head"] == git(origin, "branch", "--list", res.branch).strip()

    # Night 2: same environment, new tuning result -> same branch, same PR, updated in place.
    _, text2, res2, out2 = night(16)
    keep += [res2, out2]
    assert res2.branch == res.branch and res2.status == "pushed"
    assert out2.action == "updated" and out2.number == out.number and len(fake_gh.state.pulls) == 1

    # Night 3: a human pushed to the branch -> no push, one comment.
    work = tmp_path / "human"
    git(tmp_path, "clone", "-q", "--branch", res.branch, str(origin), str(work))
    (work / "mamba2_kernels/configs/h200.yaml").write_text("# hand-tuned\n")
    git(work, "commit", "-qam", "hand tune")
    git(work, "push", "-q", "origin", res.branch)
    res3 = repo.update(
        make_source(new_configs(32), baseline_doc(FP_NEW)),
        "h200",
        text2.fingerprint_hash,
        trigger="t",
        branch=text2.branch,
    )
    assert res3.status == "human-edit"
    out3 = client.comment_human_edit(
        FULL,
        res3.branch,
        head_sha=res3.remote_sha,
        authors=[c.author_email for c in res3.human_commits],
        detail=res3.detail,
    )
    keep += [res3, out3]
    assert out3.action == "commented"

    # Failures: push to a vanished remote, a fetch from a path that contains the token, a GitHub 404.
    prepared = ConfigRepo(tmp_path / "state2", origin_url, "main").prepare(
        make_source(new_configs(64), baseline_doc(FP_NEW)), "h200", "0" * 64, trigger=f"leak {TOKEN}"
    )
    origin.rename(origin.with_name("gone.git"))
    with pytest.raises(PushFailed) as e1:
        ConfigRepo(tmp_path / "state2", origin_url, "main").push(prepared)
    with pytest.raises(FetchFailed) as e2:
        ConfigRepo(tmp_path / "state3", f"file://{tmp_path}/{TOKEN}/x.git", "main").sync()
    with pytest.raises(GitHubError) as e3:
        client.open_or_update_pr("octo/missing", "b", "main", "t", "b", [], "h200", "0" * 64)
    fake_gh.violations[:] = [v for v in fake_gh.violations if "/repos/octo/missing" not in v]
    keep += [prepared]

    captured = capfd.readouterr()
    texts = [captured.out, captured.err, debug_logs.text]
    texts += [r.getMessage() for r in debug_logs.records]
    for e in (e1.value, e2.value, e3.value):
        texts += [str(e), repr(e), repr(e.args)] + [str(v) for v in vars(e).values()]
    for obj in keep:
        texts.append(repr(obj))
        if dataclasses.is_dataclass(obj):
            texts.append(json.dumps(dataclasses.asdict(obj), default=str))
        elif hasattr(obj, "to_dict"):
            texts.append(json.dumps(obj.to_dict(), default=str))
    texts += [json.dumps(r.json) for r in fake_gh.requests] + [r.path for r in fake_gh.requests]
    texts.append(git(tmp_path / "state2" / "clone", "log", "--all", "--format=%B"))
    assert debug_logs.records, "expected debug records to inspect"
    leaks = [t for t in texts if TOKEN in t]
    assert leaks == []
    assert "***" in str(e2.value)  # the token in the path was scrubbed, not just absent


def test_pr_api_url_from_the_command_line_is_where_the_token_goes(
    tmp_path, origin_url, make_source, fake_gh, monkeypatch
):
    """`pr --api-url` (a GitHub Enterprise) reaches the PR flow's client: the token never goes elsewhere."""
    import argparse

    from mamba2_guard.adapters import github
    from mamba2_guard.commands import pr
    from mamba2_guard.config import GuardConfig
    from mamba2_guard.flows.pr import run_pr

    monkeypatch.setattr(github, "DEFAULT_BASE_URL", "http://127.0.0.1:9/not-this-one")
    args = argparse.Namespace(repo=FULL, origin=origin_url, api_url=fake_gh.api)
    cfg = pr.with_overrides(GuardConfig(), args)
    outcome = run_pr(tmp_path / "state", cfg, FP_NEW, "h200", root=make_source(new_configs(8), baseline_doc(FP_NEW)))
    assert outcome.github["action"] == "created", outcome.messages
    assert len(fake_gh.state.pulls) == 1
