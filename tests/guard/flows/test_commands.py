"""``drift``, ``pr`` and the nightly's re-tune/PR step on CPU; the guard config file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mamba2_guard import cli
from mamba2_guard import config as guard_config
from mamba2_guard.adapters import fingerprint
from mamba2_kernels import config_store


@pytest.fixture(scope="module")
def current_fp():
    return fingerprint.collect().to_dict()


def make_root(tmp_path: Path, fp: dict, **changes) -> Path:
    root = tmp_path / "root"
    cf = config_store.ConfigFile(fingerprint={**fp, **changes}, tuned={"date": "2026-01-01", "effort": "quick"},
                                 kernels={"chunk_cumsum_k": {"tokens=64": {"num_warps": 4}}})
    config_store.save(root / "mamba2_kernels" / "configs" / "cpu.yaml", cf)
    return root


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_drift_exit_codes_and_json(tmp_path, capsys, current_fp):
    state = str(tmp_path / "state")
    root = make_root(tmp_path, current_fp)
    code, out, _ = run_cli(capsys, "drift", "--root", str(root), "--state-dir", state, "--json")
    assert code == 0 and json.loads(out)["found"] is False

    root = make_root(tmp_path, current_fp, helion="0.0.1-other")
    code, out, _ = run_cli(capsys, "drift", "--root", str(root), "--state-dir", state, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["found"] is True and doc["action"] == "retune" and doc["classes"] == ["software"]
    assert doc["items"][0]["component"] == "helion" and doc["items"][0]["before"] == "0.0.1-other"
    assert doc["configs"].endswith("mamba2_kernels/configs/cpu.yaml") and doc["config"] == "embedded defaults"

    code, out, _ = run_cli(capsys, "drift", "--root", str(root), "--state-dir", state)
    assert code == 1 and "helion: 0.0.1-other ->" in out and "action: retune" in out

    # The policy in the guard config decides.
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "guard.yaml").write_text("drift:\n  policy:\n    software: {helion: ignore}\n")
    code, out, _ = run_cli(capsys, "drift", "--root", str(root), "--state-dir", state, "--json")
    assert code == 0 and json.loads(out)["items"][0]["action"] == "ignore"

    # No configs at all: on a CPU that is no drift (nothing runs compiled); on a GPU it is new-gpu
    # (tests/guard/core/test_drift.py).
    (tmp_path / "empty").mkdir()
    code, out, _ = run_cli(capsys, "drift", "--root", str(tmp_path / "empty"), "--state-dir", state, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["classes"] == [] and any("no GPU" in note for note in doc["notes"])


def test_guard_config_errors_name_file_and_key(tmp_path, capsys):
    bad = tmp_path / "g.yaml"
    for text, key in [("drift:\n  policy: {software: {helion: sometimes}}\n", "drift.policy"),
                      ("github: {repo: nope}\n", "github.repo"), ("autotune: {margin: 2}\n", "autotune.margin"),
                      ("gitt: {}\n", "gitt"), ("policy: {alpha: 0.01, bogus: 1}\n", "policy.bogus")]:
        bad.write_text(text)
        with pytest.raises(guard_config.GuardConfigError, match=key) as info:
            guard_config.load(bad)
        assert str(bad) in str(info.value)
    code, _, err = run_cli(capsys, "drift", "--config", str(bad), "--state-dir", str(tmp_path))
    assert code == 2 and str(bad) in err
    ok = tmp_path / "ok.yaml"
    ok.write_text("autotune: {margin: 0.05, effort: full}\ngithub: {repo: o/r}\npolicy: {threshold: 0.1}\n")
    cfg = guard_config.load(ok)
    assert cfg.criteria.margin == 0.05 and cfg.github_repo == "o/r" and cfg.verdict_policy.threshold == 0.1


def _branches(bare: Path) -> list[str]:
    out = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/heads"], cwd=bare,
                         capture_output=True, text=True, check=True).stdout
    return sorted(out.split())


def test_pr_dry_run_prints_body_and_diff_and_pushes_nothing(tmp_path, capsys, current_fp):
    root = make_root(tmp_path, current_fp)
    state = tmp_path / "state"
    code, out, _ = run_cli(capsys, "pr", "--dry-run", "--root", str(root), "--state-dir", str(state))
    assert code == 0
    assert "<!-- mamba2-guard:gpu=cpu fingerprint=" in out
    assert "+++ b/mamba2_kernels/configs/cpu.yaml" in out and '+    tokens=64: {"num_warps": 4}' in out
    assert "dry run: nothing committed or pushed" in out
    assert not state.exists()  # a dry run changes nothing, not even the state directory
    bare = state / "pr" / "origin.git"

    # Without --dry-run: the branch goes to the bare repo; GitHub is skipped (nothing configured).
    code, out, _ = run_cli(capsys, "pr", "--root", str(root), "--state-dir", str(state), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["git"]["status"] == "pushed"
    assert any("GitHub step skipped" in m for m in doc["messages"])
    assert _branches(bare) == sorted(["refs/heads/main", f"refs/heads/{doc['branch']}"])


def test_nightly_on_cpu_reports_drift_skips_retune_and_pr_is_dry(tmp_path, current_fp):
    from mamba2_guard.flows.nightly import CycleOptions, run_cycle

    root = make_root(tmp_path, current_fp, helion="0.0.1-other")
    state = tmp_path / "state"
    messages: list[str] = []
    outcome = run_cycle(state, CycleOptions(shapes=("smoke",), kernels=("chunk_cumsum",), confirm=False,
                                            root=str(root)), progress=messages.append)
    assert outcome.drift.action == "retune" and outcome.drift.classes == ("software",)
    assert outcome.steps["retune"]["status"] == "skipped"
    assert any("re-tune skipped" in m and "no GPU" in m for m in messages)
    assert outcome.steps["pr"]["status"] == "dry-run"
    assert any("PR step dry" in m for m in messages)
    assert Path(outcome.paths["pr_body"]).read_text().count("mamba2-guard:gpu=cpu") == 1
    assert not (state / "pr").exists()
    # the metrics carry the drift as an event (a dashboard annotation); no re-tune or PR happened
    snapshot = json.loads((state / "latest.json").read_text())
    assert set(snapshot["events"]) == {"drift"} and snapshot["drift"]["found"] is True
    assert "mamba2_guard_drift" in (state / "metrics" / "mamba2_guard.prom").read_text()


def test_pr_target_from_the_command_line(tmp_path, capsys, current_fp):
    root = make_root(tmp_path, current_fp)
    bare = tmp_path / "elsewhere.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    subprocess.run(["git", "push", "-q", str(bare), "HEAD:refs/heads/main"], check=True,
                   cwd=Path(cli.__file__).resolve().parent.parent)
    code, out, _ = run_cli(capsys, "pr", "--dry-run", "--json", "--root", str(root), "--state-dir",
                           str(tmp_path / "state"), "--origin", str(bare), "--repo", "owner/name")
    doc = json.loads(out)
    assert code == 0 and doc["origin"] == str(bare) and _branches(bare) == ["refs/heads/main"]
    code, _, err = run_cli(capsys, "pr", "--dry-run", "--root", str(root), "--state-dir", str(tmp_path / "s2"),
                           "--repo", "no-slash")
    assert code == 2 and "--repo: expected OWNER/NAME" in err


def test_pr_refuses_an_unknown_slug_and_another_machines_gpu(tmp_path, capsys, current_fp):
    """A misspelt --gpu-slug exits 2 with "did you mean" (it used to exit 0 with "nothing to propose"), and a
    PR for a GPU this machine is not (here: a CPU machine, for an H200 file) exits 2 before drafting: the
    body would carry this machine's fingerprint as the H200's environment."""
    root = make_root(tmp_path, current_fp)
    config_store.save(root / "mamba2_kernels" / "configs" / "nvidia-h200.yaml",
                      config_store.ConfigFile(fingerprint=current_fp, tuned={}, kernels={}))
    state = str(tmp_path / "state")
    code, out, err = run_cli(capsys, "pr", "--dry-run", "--root", str(root), "--state-dir", state,
                             "--gpu-slug", "nvidia-h2000")
    assert code == 2 and not out
    assert err.startswith("mamba2-guard: pr: --gpu-slug: unknown GPU slug 'nvidia-h2000'; did you mean 'nvidia-h200'?")
    code, out, err = run_cli(capsys, "pr", "--dry-run", "--root", str(root), "--state-dir", state,
                             "--gpu-slug", "nvidia-h200")
    assert code == 2 and not out
    assert "--gpu-slug: this machine's GPU is cpu, not nvidia-h200" in err and len(err.splitlines()) == 1
