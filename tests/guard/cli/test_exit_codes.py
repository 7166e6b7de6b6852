"""The exit codes of the real console script: 0 ok; 1 a regression or precision failure only; 2 every usage
or environment error, as one line naming the flag or the file, never a traceback (docs/failure-model.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.guard import sample
from tests.guard.live import REPO, free_port

SCRIPT = shutil.which("mamba2-guard", path=str(Path(sys.executable).parent)) or "mamba2-guard"
NIGHTLY = ["nightly", "--shapes", "smoke", "--kernels", "chunk_cumsum", "--no-confirm"]


def _run(argv, env=None, cwd=REPO):
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([SCRIPT, *argv], capture_output=True, text=True, timeout=300, env=environ, cwd=cwd)


def _snapshot(state: Path) -> Path:
    state.mkdir(parents=True, exist_ok=True)
    (state / "latest.json").write_text(json.dumps(sample.snapshot()))
    return state


def _file(t: Path, name: str, data: bytes) -> str:
    (t / name).write_bytes(data)
    return str(t / name)


def _checkout(t: Path, configs: bytes) -> str:
    """A checkout holding gpu-x's config file with ``configs``: what `pr --root` proposes."""
    (t / "root" / "mamba2_kernels" / "configs").mkdir(parents=True)
    (t / "root" / "mamba2_kernels" / "configs" / "gpu-x.yaml").write_bytes(configs)
    return str(t / "root")


def _config(t: Path, text: bytes) -> list[str]:
    """`config check` of a guard.yaml holding ``text``."""
    return ["config", "check", _file(t, "g.yaml", text + b"\n")]


def _result(t: Path) -> str:
    return _file(t, "result.json", json.dumps(sample.result()).encode())


# (id, argv(tmp), env(tmp), expected exit code, what the one line must name)
USAGE = [
    ("rounds-0", lambda t: [*NIGHTLY, "--rounds", "0"], {}, "--rounds"),
    ("rounds-negative", lambda t: [*NIGHTLY, "--rounds", "-5"], {}, "--rounds"),
    ("rounds-not-a-number", lambda t: ["bench", "--rounds", "many"], {}, "--rounds"),
    ("seed-negative", lambda t: ["bench", "--seed", "-1"], {}, "--seed"),
    ("case-timeout-nan", lambda t: ["bench", "--case-timeout", "nan"], {}, "--case-timeout"),
    ("nightly-interval-negative", lambda t: ["daemon", "--nightly-interval", "-1"], {}, "--nightly-interval"),
    ("nightly-interval-0", lambda t: ["daemon", "--nightly-interval", "0"], {}, "--nightly-interval"),
    ("drift-interval-negative", lambda t: ["daemon", "--drift-interval", "-60"], {}, "--drift-interval"),
    ("nightly-timeout-negative", lambda t: ["daemon", "--nightly-timeout", "-1"], {}, "--nightly-timeout"),
    ("metrics-port-too-big", lambda t: ["daemon", "--metrics-port", "70000"], {}, "--metrics-port"),
    ("nightly-cron-4-fields", lambda t: ["daemon", "--nightly-cron", "17 3 * *", "--state-dir", str(t / "s")], {},
     "--nightly-cron"),
    ("nightly-cron-minute-61", lambda t: ["daemon", "--nightly-cron", "61 3 * * *", "--state-dir", str(t / "s")], {},
     "--nightly-cron"),
    ("daemon-option-rounds-0", lambda t: ["daemon", "-o", "rounds=0", "--state-dir", str(t / "s")], {}, "-o rounds"),
    ("daemon-option-unknown-suite", lambda t: ["daemon", "-o", "suite=nightly", "--state-dir", str(t / "s")], {},
     "-o suite: unknown suite 'nightly'"),
    ("daemon-option-shapes-not-a-list", lambda t: ["daemon", "-o", "shapes=smoke", "--state-dir", str(t / "s")], {},
     "-o shapes: expected a list"),
    ("daemon-option-unknown-kernel", lambda t: ["daemon", "-o", "kernels=[chunk_scna]", "--state-dir", str(t / "s")],
     {}, "-o kernels: unknown kernel 'chunk_scna'"),
    ("daemon-option-confirm-not-a-bool", lambda t: ["daemon", "-o", "confirm=maybe", "--state-dir", str(t / "s")],
     {}, "-o confirm"),
    ("gpu-slug-leaves-the-folder", lambda t: ["drift", "--gpu-slug", "../other"], {}, "--gpu-slug"),
    ("dev-gpu-slug-with-a-space", lambda t: ["dev", "measure-selection", "--out", str(t / "m.jsonl"), "--gpu-slug",
                                             "nvidia h200"], {}, "--gpu-slug"),
    ("kill-grace-inf", lambda t: ["daemon", "--kill-grace", "inf"], {}, "--kill-grace"),
    ("margin-over-1", lambda t: ["autotune", "--margin", "2"], {}, "--margin"),
    ("autotune-workers-0", lambda t: ["autotune", "--workers", "0"], {}, "--workers"),
    ("budget-negative", lambda t: ["autotune", "--budget-seconds", "-10"], {}, "--budget-seconds"),
    ("dev-runs-0", lambda t: ["dev", "calibrate", "--json", "x", "--runs", "0"], {}, "--runs"),
    ("first-call-unknown-entry", lambda t: ["dev", "first-call", "--shapes", "smoke", "--entries", "nope"], {},
     "unknown kernel 'nope'"),
    ("eager-step-unknown-shape", lambda t: ["dev", "eager-step", "--shapes", "nope", "--out", str(t / "e.json")], {},
     "unknown shape 'nope'"),
    ("eager-step-without-a-gpu", lambda t: ["dev", "eager-step", "--shapes", "smoke", "--out", str(t / "e.json")],
     {"CUDA_VISIBLE_DEVICES": ""}, "needs a CUDA GPU"),
    ("first-call-record-without-a-gpu", lambda t: ["dev", "first-call", "--shapes", "smoke", "--record"], {},
     "--record"),
    ("warm-unknown-entry", lambda t: ["dev", "warm", "--shapes", "smoke", "--entries", "nope"], {},
     "unknown kernel 'nope'"),
    ("state-env-under-a-file", lambda t: ["list"], {"MAMBA2_GUARD_STATE": "/etc/hostname/state"},
     "MAMBA2_GUARD_STATE"),
    ("pushgateway-env-not-a-url", lambda t: ["list"], {"MAMBA2_GUARD_PUSHGATEWAY": "localhost"},
     "MAMBA2_GUARD_PUSHGATEWAY"),
    ("tuner-env-not-a-target", lambda t: ["list"], {"MAMBA2_GUARD_TUNER": "nope"}, "MAMBA2_GUARD_TUNER"),
    ("paths-env-unknown-path", lambda t: ["list"], {"MAMBA2_GUARD_PATHS": "chunk_scan=maybe"},
     "$MAMBA2_GUARD_PATHS: expected stage=path pairs"),
    ("state-env-empty", lambda t: ["list"], {"MAMBA2_GUARD_STATE": " "}, "MAMBA2_GUARD_STATE"),
    ("seen-env-a-directory", lambda t: ["list"], {"MAMBA2_GUARD_SEEN": "/tmp"},
     "$MAMBA2_GUARD_SEEN: /tmp is a directory"),
    ("state-dir-a-file", lambda t: ["bench", "--shapes", "smoke", "--kernels", "chunk_cumsum", "--state-dir",
                                    _file(t, "f", b"x")], {}, "--state-dir"),
    ("nightly-out-a-file", lambda t: [*NIGHTLY, "--state-dir", str(t / "s"), "--out", _file(t, "f", b"x")], {},
     "--out"),
    # a folder that cannot be made (even by root), refused before the bench rather than after it
    ("nightly-out-not-writable", lambda t: [*NIGHTLY, "--state-dir", str(t / "s"), "--out", "/proc/mamba2-out"], {},
     "--out: cannot write into /proc/mamba2-out"),
    ("drift-root-missing", lambda t: ["drift", "--root", str(t / "nope"), "--state-dir", str(t / "s")], {}, "--root"),
    ("bench-json-a-directory", lambda t: ["bench", "--shapes", "smoke", "--kernels", "chunk_cumsum", "--json",
                                          str(t), "--state-dir", str(t / "s")], {},
     "is a directory; expected a file path"),
    ("bench-json-under-a-file", lambda t: ["bench", "--shapes", "smoke", "--kernels", "chunk_cumsum", "--json",
                                           str(Path(_file(t, "f", b"x")) / "r.json"), "--state-dir", str(t / "s")],
     {}, "--json"),
    ("record-results-root-missing", lambda t: ["dev", "record-results", _result(t), "--root", str(t / "nope")], {},
     "--root"),
    ("restamp-root-missing", lambda t: ["dev", "restamp", "--all", "--gpu-slug", "nvidia-h200", "--root",
                                        str(t / "nope")], {}, "--root"),
    ("suite-and-shapes", lambda t: ["bench", "--suite", "zoo", "--shapes", "smoke"], {}, "--shapes"),
    ("dev-suite-and-shapes", lambda t: ["dev", "first-call", "--suite", "zoo-fit", "--shapes", "smoke"], {},
     "--shapes"),
    ("sweep-out-a-directory", lambda t: ["dev", "sweep", _file(t, "spec.json", b"[]"), "--out", str(t)], {}, "--out"),
    ("pr-api-url-not-a-url", lambda t: ["pr", "--dry-run", "--api-url", "github.example", "--state-dir",
                                        str(t / "s")], {}, "--api-url"),
    ("config-overrides-a-list", lambda t: _config(t, b"policy: {overrides: [1]}"), {},
     "policy.overrides: expected a mapping"),
    ("config-override-misspelt", lambda t: _config(t, b"policy: {overrides: {chunk_scna: {threshold: 0.1}}}"), {},
     "did you mean 'chunk_scan'?"),
    ("config-budget-negative", lambda t: _config(t, b"autotune: {budget_seconds: -10}"), {}, "autotune.budget_seconds"),
    ("config-budget-infinite", lambda t: _config(t, b"autotune: {budget_seconds: 1.0e+400}"), {}, "got inf"),
    ("config-rounds-0", lambda t: _config(t, b"autotune: {rounds: 0}"), {}, "autotune.rounds"),
    ("config-attempts-0", lambda t: _config(t, b"autotune: {max_attempts: 0}"), {}, "autotune.max_attempts"),
    ("config-job-timeout-0", lambda t: _config(t, b"autotune: {job_timeout_seconds: 0}"), {},
     "autotune.job_timeout_seconds"),
    ("config-not-utf8", lambda t: ["config", "check", _file(t, "g.yaml", b"\xff\xfe")], {}, "g.yaml: not valid YAML"),
    ("baseline-not-utf8", lambda t: ["check", "--result", _result(t), "--baseline", _file(t, "b.yaml", b"\xff"),
                                     "--state-dir", str(t / "s")], {}, "b.yaml: not valid YAML"),
    ("baseline-empty", lambda t: ["check", "--result", _result(t), "--baseline", _file(t, "b.yaml", b""),
                                  "--state-dir", str(t / "s")], {}, "--baseline"),
    ("fit-selection-not-utf8", lambda t: ["fit-selection", _file(t, "m.jsonl", b"\xff"), "--out",
                                          _file(t, "c.yaml", b"{}\n")], {}, "m.jsonl: not JSON lines"),
    ("fit-selection-empty", lambda t: ["fit-selection", _file(t, "m.jsonl", b""), "--out",
                                       _file(t, "c.yaml", b"{}\n")], {}, "m.jsonl: no measurement records"),
    ("pr-origin-unreachable", lambda t: ["pr", "--origin", str(t / "no-such-remote.git"), "--state-dir",
                                         str(t / "s")], {}, "no-such-remote.git"),
    # (on a machine that runs as gpu-x: a PR for another GPU than this machine's is refused before)
    ("pr-configs-a-list", lambda t: ["pr", "--root", _checkout(t, b"- 1\n- 2\n"), "--gpu-slug", "gpu-x",
                                     "--origin", str(t / "o.git"), "--state-dir", str(t / "s")],
     {"MAMBA2_GUARD_GPU_SLUG": "gpu-x"}, "gpu-x.yaml"),
    ("pr-dry-run-bad-yaml", lambda t: ["pr", "--dry-run", "--root", _checkout(t, b"kernels: [\n"), "--gpu-slug",
                                       "gpu-x", "--state-dir", str(t / "s")], {"MAMBA2_GUARD_GPU_SLUG": "gpu-x"},
     "gpu-x.yaml: not valid YAML"),
    ("sweep-spec-not-json", lambda t: ["dev", "sweep", _file(t, "spec.json", b"[1"), "--out", str(t / "o.json")], {},
     "spec.json"),
    ("snapshot-not-json", lambda t: ["metrics", "show", "--snapshot", _file(t, "latest.json", b"{torn"), "--state-dir",
                                     str(t / "s")], {}, "--snapshot: no usable snapshot at"),
    ("daemon-option-config-missing", lambda t: ["daemon", "-o", f"config={t / 'nope.yaml'}", "--state-dir",
                                                str(t / "s")], {}, "-o config"),
    ("daemon-option-out-dir-a-file", lambda t: ["daemon", "-o", f"out_dir={_file(t, 'f', b'x')}", "--state-dir",
                                                str(t / "s")], {}, "-o out_dir"),
    ("daemon-metrics-addr-unresolvable", lambda t: ["daemon", "--metrics-addr", "no-such-host.invalid",
                                                    "--metrics-port", str(free_port()), "--state-dir", str(t / "s")],
     {}, "--metrics-addr no-such-host.invalid"),
]


# The usage errors checked with torch loaded: kernel names (the registry holds the kernels), the GPU dev tools
# (eager-step and sweep import torch with their module) and a PR's fingerprint (what torch sees of the GPU).
# Every other one answers before torch loads, at once.
NEEDS_TORCH = {"daemon-option-unknown-kernel", "first-call-unknown-entry", "first-call-record-without-a-gpu",
               "warm-unknown-entry", "config-override-misspelt", "eager-step-unknown-shape",
               "eager-step-without-a-gpu", "pr-origin-unreachable", "pr-configs-a-list", "pr-dry-run-bad-yaml",
               "sweep-spec-not-json"}


@pytest.fixture(scope="module")
def torch_that_fails(tmp_path_factory) -> str:
    """A folder whose ``torch`` package fails to import: first on the path, it stands for torch not loaded yet."""
    folder = tmp_path_factory.mktemp("no-torch")
    (folder / "torch").mkdir()
    (folder / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    return str(folder)


@pytest.mark.parametrize("case,argv,env,names", USAGE, ids=[c[0] for c in USAGE])
def test_usage_errors_exit_2_with_one_line_naming_the_flag(tmp_path, torch_that_fails, case, argv, env, names):
    if case not in NEEDS_TORCH:
        env = {"PYTHONPATH": f"{torch_that_fails}{os.pathsep}{REPO}", **env}
    done = _run(argv(tmp_path), env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in done.stderr, done.stderr


def _corrupt_history(t: Path) -> list[str]:
    (t / "state").mkdir()
    (t / "state" / "history.sqlite").write_bytes(b"not a database" * 100)
    return [*NIGHTLY, "--state-dir", str(t / "state")]


def _empty_history(t: Path) -> list[str]:
    (t / "state").mkdir()
    (t / "state" / "history.sqlite").write_bytes(b"")
    return [*NIGHTLY, "--state-dir", str(t / "state")]


def _state_under_a_file(t: Path) -> list[str]:
    (t / "file").write_text("x")
    return [*NIGHTLY, "--state-dir", str(t / "file" / "state")]


def _bad_config(t: Path) -> list[str]:
    (t / "bad.yaml").write_text("autotune: {margin: [1\n")
    return [*NIGHTLY, "--state-dir", str(t / "s"), "--config", str(t / "bad.yaml")]


ENVIRONMENT = [
    ("corrupt-history", _corrupt_history, {}, "history.sqlite"),
    ("history-truncated-to-0-bytes", _empty_history, {}, "history.sqlite"),
    ("state-dir-under-a-file", _state_under_a_file, {}, "file"),
    ("read-only-state-dir", lambda t: [*NIGHTLY, "--state-dir", "/sys/mamba2-guard"], {}, "/sys/mamba2-guard"),
    ("full-disk", lambda t: [*NIGHTLY, "--state-dir", str(t / "s")], {"GITHUB_STEP_SUMMARY": "/dev/full"},
     "/dev/full"),
    ("bad-config", _bad_config, {}, "bad.yaml"),
    ("unreachable-pushgateway",
     lambda t: ["metrics", "push", "--state-dir", str(_snapshot(t / "s")), "--gateway",
                f"http://127.0.0.1:{free_port()}"], {}, "127.0.0.1"),
]


@pytest.mark.parametrize("argv,env,names", [c[1:] for c in ENVIRONMENT], ids=[c[0] for c in ENVIRONMENT])
def test_environment_errors_exit_2_with_one_line_naming_the_file(tmp_path, argv, env, names):
    done = _run(argv(tmp_path), env)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("mamba2-guard")]
    assert len(lines) == 1 and names in lines[0], done.stderr
    assert done.stderr.strip().splitlines()[-1] == lines[0], done.stderr  # the error ends it: no line runs on
    assert "Traceback" not in done.stderr, done.stderr
    benched = "[1/" in done.stdout + done.stderr
    if env.get("GITHUB_STEP_SUMMARY") == "/dev/full":  # fails after the bench: the result and report are kept
        assert benched and list((tmp_path / "s" / "reports").glob("*-result.json"))
        assert list((tmp_path / "s" / "reports").glob("*-report.md"))
    else:
        assert not benched, "checked only after the bench"


@pytest.mark.parametrize("argv,names", [(["list", "--suite", "seen"], "--suite seen: "),
                                        (["autotune", "--seen"], "--seen: ")], ids=["list-suite-seen", "autotune-seen"])
def test_an_unreadable_seen_file_is_named_not_taken_for_nothing_seen(tmp_path, argv, names):
    """A torn seen-keys file: exit 2 with its reason, not "no call fell back" (list) or nothing to tune, 0."""
    seen = _file(tmp_path, "seen.json", b"[1, 2")
    done = _run([*argv, *(["--state-dir", str(tmp_path / "s")] if argv[0] == "autotune" else [])],
                {"MAMBA2_GUARD_SEEN": seen})
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"mamba2-guard: {names}{seen}: not a readable seen-keys file"), done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_ok_and_precision_failure_exit_0_and_1(tmp_path):
    from mamba2_guard.core.results import BenchResult

    assert _run(["list", "--suite", "smoke"]).returncode == 0
    doc = sample.result()
    doc["cases"][0]["precision"]["ok"] = False
    doc["cases"][0]["precision"]["allclose"] = False
    path = tmp_path / "result.json"
    path.write_text(json.dumps(BenchResult.from_dict(doc).to_dict()))
    done = _run(["check", "--result", str(path), "--state-dir", str(tmp_path / "s")])
    assert done.returncode == 1, done.stdout + done.stderr


def test_a_first_history_open_cut_short_leaves_no_empty_history(tmp_path):
    """A full disk (here: a file size limit) or a kill while the first run creates history.sqlite: that run
    fails, and the next one finds a usable history, not an empty file that reads as a truncated one."""
    import resource

    path = tmp_path / "result.json"
    path.write_text(json.dumps(sample.result()))
    argv = [SCRIPT, "check", "--result", str(path), "--state-dir", str(tmp_path / "s")]
    environ = {**os.environ, "PYTHONPATH": str(REPO)}

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # SQLite's first page is 4096 bytes

    full = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=environ, cwd=REPO,
                          preexec_fn=small_disk)
    assert full.returncode == 2 and "history.sqlite" in full.stderr and "Traceback" not in full.stderr, full.stderr
    done = _run(argv[1:])
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert not list((tmp_path / "s").glob(".*.tmp"))
