"""The installed ``mamba2-guard`` console script, run in a subprocess as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mamba2_guard import __version__

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(sys.executable).parent / "mamba2-guard"
EXAMPLE = REPO / "deploy" / "guard.example.yaml"


def guard(*argv: str, columns: int | None = None, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    if columns is not None:
        environ["COLUMNS"] = str(columns)
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=timeout,
                          env={**environ, **env}, cwd=REPO)


def one_line_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0]


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_help_version_and_exit_codes():
    done = guard("--help")
    assert done.returncode == 0
    assert "``" not in done.stdout and "exit codes:" in done.stdout and "2  a usage or environment error" in done.stdout
    assert guard("--version").stdout.strip() == f"mamba2-guard {__version__}"
    for command in ("doctor", "fingerprint", "list", "bench", "check", "nightly", "daemon", "metrics", "drift",
                    "autotune", "pr", "config", "dev"):
        text = guard(command, "--help").stdout
        description = text.split("\n\n")[1]
        assert not description.startswith(("options:", "positional")), f"{command} has no description"
        assert "(default default)" not in text and "daemon_cycle" not in text
    bench = guard("bench", "--help").stdout
    assert "(default: 30)" in bench and "(default: 0)" in bench


def test_doctor_is_fast_and_short():
    done = guard("doctor", timeout=10)
    assert done.returncode == 0, done.stderr
    assert "environment ok" in done.stdout and "kernel_sources" not in done.stdout
    assert len(done.stdout.splitlines()) <= 3


@pytest.mark.parametrize("command", ["bench", "nightly"])
def test_unknown_suite_lists_valid_names(command, tmp_path):
    one_line_error(guard(command, "--suite", "nosuch", "--state-dir", str(tmp_path)),
                   "unknown suite 'nosuch'", "valid suites: default, heldout-wide, selection-grid, smoke")


def test_autotune_checks_names_before_the_gpu(tmp_path):
    one_line_error(guard("autotune", "--kernels", "nosuch", "--state-dir", str(tmp_path)),
                   "unknown kernel 'nosuch'", "valid kernels: chunk_cumsum")


def test_check_names_a_missing_file(tmp_path):
    one_line_error(guard("check", "--baseline", str(tmp_path / "nope.yaml"), "--state-dir", str(tmp_path)),
                   "--baseline: no such file", "nope.yaml")
    one_line_error(guard("check", "--result", "nope.json", "--state-dir", str(tmp_path)),
                   "--result: no such file: nope.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    one_line_error(guard("check", "--result", str(broken), "--state-dir", str(tmp_path)),
                   f"--result: {broken}: not a bench result")


def test_daemon_rejects_unknown_options_at_once(tmp_path):
    one_line_error(guard("daemon", "-o", "suit=smoke", "--state-dir", str(tmp_path), timeout=30),
                   "unknown option(s) suit", "valid: suite")
    assert not (tmp_path / "daemon.lock").exists()


def test_config_check(tmp_path):
    done = guard("config", "check", str(EXAMPLE))
    assert done.returncode == 0 and "ok" in done.stdout
    bad = tmp_path / "guard.yaml"
    bad.write_text("autotune: {budget_secnds: 10}\n")
    one_line_error(guard("config", "check", str(bad)), "autotune.budget_secnds: unknown key")
    bad.write_text("github: [\n")
    one_line_error(guard("config", "check", "--state-dir", str(tmp_path)), "guard.yaml", "not valid YAML")
    one_line_error(guard("config", "check", str(tmp_path / "nope.yaml")), "nope.yaml", "no such file")


def test_a_yaml_error_is_one_line(tmp_path):
    """PyYAML's message spans lines (a caret under the column): every command prints it on one."""
    bad = tmp_path / "broken.yaml"
    bad.write_text("github: [\n")
    one_line_error(guard("nightly", "--config", str(bad), "--state-dir", str(tmp_path / "state")),
                   "broken.yaml: not valid YAML", "line 2, column 1")
    one_line_error(guard("dev", "selected", "--shapes", "smoke", "--against", str(bad)),
                   "broken.yaml: not valid YAML")


def test_pr_dry_run_changes_nothing(tmp_path):
    state = tmp_path / "state"
    done = guard("pr", "--dry-run", "--state-dir", str(state))
    assert done.returncode == 0, done.stderr
    assert "nothing to propose" in done.stdout and "new baseline" not in done.stdout
    assert not state.exists()


@pytest.mark.slow
def test_bench_ends_with_a_comparison_table_in_80_columns(tmp_path):
    done = guard("bench", "--kernels", "chunk_cumsum", "--state-dir", str(tmp_path), columns=80)
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if "kernel" in line)
    for column in ("shape", "ours ms", "mamba-ssm ms", "speedup", "precision"):
        assert column in header
    assert "chunk_cumsum" in done.stdout and "ok (rel err" in done.stdout
    assert widest(done.stdout.split("result:")[0]) <= 80


@pytest.mark.slow
def test_check_finds_the_nightly_result_and_fits_80_columns(tmp_path):
    state = str(tmp_path / "state")
    nightly = guard("nightly", "--kernels", "chunk_cumsum", "--no-confirm", "--state-dir", state)
    assert nightly.returncode == 0, nightly.stderr
    # one fingerprint id: the one the run prints is the one its report.md names
    shown = re.search(r"fingerprint ([0-9a-f]{12}) on", nightly.stdout + nightly.stderr).group(1)
    report_md = re.search(r"report_md: (\S+)", nightly.stdout).group(1)
    assert f"fingerprint `{shown}`" in Path(report_md).read_text()
    check = guard("check", "--state-dir", state, columns=80)
    assert check.returncode == 0, check.stderr
    table = check.stdout.split("report:")[0]
    assert "chunk_cumsum smoke" in table and widest(table) <= 80
    wide = guard("check", "--state-dir", state, columns=200)
    assert "chunk_cumsum smoke" in wide.stdout


@pytest.mark.parametrize("text,expected", [("- a\n", "expected a mapping (fingerprint, cases, ...), got list"),
                                           ("fingerprint: [1]\n", "fingerprint: expected a mapping, got list")])
def test_drift_names_a_baseline_that_is_no_mapping(tmp_path, text, expected):
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "gpu-a.yaml").write_text(text)
    one_line_error(guard("drift", "--root", str(tmp_path), "--gpu-slug", "gpu-a"), "gpu-a.yaml", expected)
