"""The command line: exit codes and errors that list the valid names."""

from __future__ import annotations

import json

from mamba2_guard import cli
from mamba2_guard.bench.timing import METHOD_VERSION


def test_unknown_kernel_suggests_the_closest_and_exits_2(capsys):
    assert cli.main(["list", "--kernels", "chunk_stat"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "did you mean 'chunk_state'?" in err and len(err.strip()) < 80


def test_unknown_shape_and_suite_exit_2(capsys):
    assert cli.main(["list", "--shapes", "nano"]) == cli.EXIT_USAGE
    assert "valid shapes:" in capsys.readouterr().err
    assert cli.main(["list", "--suite", "nightly"]) == cli.EXIT_USAGE
    assert "valid suites: default, heldout-wide, selection-grid, smoke" in capsys.readouterr().err


def test_fingerprint_json(capsys):
    assert cli.main(["fingerprint", "--json"]) == cli.EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert {"gpu_name", "driver_version", "torch", "triton", "helion", "mamba_ssm", "kernels_source_hash"} <= set(data)


def _without_helion(monkeypatch, name):
    from mamba2_kernels import registry

    entry = registry.get(name)
    monkeypatch.setitem(registry.REGISTRY, name, registry.KernelEntry(**{**entry.__dict__, "helion": None}))


def test_bench_reports_missing_kernels_and_check_exits_by_policy(tmp_path, monkeypatch, capsys):
    _without_helion(monkeypatch, "chunk_state")
    out = tmp_path / "result.json"
    state = ["--state-dir", str(tmp_path / "state")]
    code = cli.main(["bench", "--shapes", "smoke", "--kernels", "chunk_state", "bmm_chunk", "--json", str(out), *state])
    assert code == cli.EXIT_OK
    written = json.loads(out.read_text())
    assert written["fingerprint"]["timing_method"] == METHOD_VERSION
    cases = {c["kernel"]: c for c in written["cases"]}
    assert cases["chunk_state"]["missing"] is True and cases["chunk_state"]["precision"] is None
    assert cases["bmm_chunk"]["precision"]["ok"] is True and cases["bmm_chunk"]["timings_meaningful"] is False
    # a missing kernel is reported, never passing; it fails the check only with --strict
    assert cli.main(["check", "--result", str(out), *state]) == cli.EXIT_OK
    assert cli.main(["check", "--result", str(out), "--strict", *state]) == cli.EXIT_FAIL
    report = sorted((tmp_path / "state" / "reports").glob("*-report.md"))[-1].read_text()
    assert "missing-kernel" in report and "chunk_state" in report


def test_nightly_on_cpu_records_history_and_reports(tmp_path, capsys):
    state = tmp_path / "state"
    assert cli.main(["nightly", "--kernels", "chunk_cumsum", "--state-dir", str(state)]) == cli.EXIT_OK
    printed = capsys.readouterr()
    assert "CPU interpret mode" in printed.out + printed.err
    from mamba2_guard.adapters.history import History

    with History(state / "history.sqlite") as history:
        runs = history.runs()
    assert [(r["job"], r["status"], r["n_cases"]) for r in runs] == [("nightly", "pass", 1)]
    assert len(list((state / "reports").glob("*-report.json"))) == 1


def test_check_judges_the_newest_result_and_records_it_once(tmp_path, capsys):
    from mamba2_guard.adapters.history import History

    state = tmp_path / "state"
    assert cli.main(["nightly", "--kernels", "chunk_cumsum", "--state-dir", str(state)]) == cli.EXIT_OK
    out = tmp_path / "elsewhere" / "bench.json"
    assert cli.main(["bench", "--shapes", "smoke", "--kernels", "chunk_cumsum", "--json", str(out), "--state-dir",
                     str(state)]) == cli.EXIT_OK
    capsys.readouterr()
    for _ in range(2):
        assert cli.main(["check", "--state-dir", str(state)]) == cli.EXIT_OK
    printed = capsys.readouterr().out
    assert printed.count(f"judged: {out} (the newest result") == 2  # the bench's, not the older nightly's
    assert "not recorded again" in printed
    with History(state / "history.sqlite") as history:
        assert sorted(r["job"] for r in history.runs()) == ["check", "nightly"]  # the check recorded once


def test_check_without_results_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["check", "--state-dir", str(tmp_path)]) == cli.EXIT_USAGE
    assert "--result: no saved bench result" in capsys.readouterr().err


def test_calibration_script_names_the_bad_argument():
    import subprocess
    import sys

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "mamba2_guard", "dev", "calibrate", *argv], capture_output=True,
                              text=True, timeout=120)

    bad = run("--kernels", "chunk_state", "--json", "x.json", "--slowdown", "5")
    assert bad.returncode == 2 and "--slowdown: expected a fraction in [0, 1), got '5'" in bad.stderr
    assert run("--kernels", "chunk_state", "--json", "x.json", "--runs", "0").returncode == 2
    unknown = run("--shapes", "no-such-shape", "--json", "x.json")
    assert unknown.returncode == 2 and "no-such-shape" in unknown.stderr
    no_gpu = run("--kernels", "chunk_state", "--json", "x.json")
    assert no_gpu.returncode == 2 and "needs a CUDA GPU" in no_gpu.stderr


def test_check_judges_by_the_guard_configs_policy(tmp_path, capsys):
    """A 10 % slower kernel is a regression at the default 5 % threshold, and not under a guard.yaml that
    sets 30 %, as the nightly would judge it; a bad policy key exits 2 before anything is read."""
    from mamba2_guard.core.results import BenchResult
    from mamba2_guard.flows import baselines
    from tests.guard import sample

    baselines.update(tmp_path / "baseline.yaml", BenchResult.from_dict(sample.result()))
    doc = sample.result("2026-09-02T03:17:00+00:00")
    slower = next(c for c in doc["cases"] if c["kernel"] == "ssd_chunk_state_fwd")
    slower["samples_ms"]["helion"] = [ms * 1.10 for ms in slower["samples_ms"]["helion"]]
    result = tmp_path / "result.json"
    result.write_text(json.dumps(BenchResult.from_dict(doc).to_dict()))

    def check(state, *extra):
        return cli.main(["check", "--result", str(result), "--baseline", str(tmp_path / "baseline.yaml"),
                         "--state-dir", str(tmp_path / state), *extra])

    assert check("default") == cli.EXIT_FAIL
    (tmp_path / "relaxed").mkdir()
    (tmp_path / "relaxed" / "guard.yaml").write_text("policy: {threshold: 0.30}\n")
    assert check("relaxed") == cli.EXIT_OK
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: {threshhold: 0.30}\n")
    capsys.readouterr()
    assert check("bad", "--config", str(bad)) == cli.EXIT_USAGE
    assert "policy.threshhold" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_list_shows_each_shape_and_the_kernels_range_over_them(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["list", "--shapes", "smoke", "nemotron3-nano-packed", "--kernels", "chunk_cumsum"]) == 0
    rows = [" ".join(line.replace("│", " ").split()) for line in capsys.readouterr().out.splitlines()]
    assert "smoke 1 x 96 4 x 16 2 16 32 float32 plain" in rows
    assert "nemotron3-nano-packed 2 x 8192 64 x 64 8 128 128 bfloat16 4 docs" in rows
    from mamba2_kernels import registry, suites

    (entry,), loaded = registry.select(["chunk_cumsum"]), suites.load()
    small, large = loaded.shape("smoke"), loaded.shape("nemotron3-nano-packed")
    (kernel,) = [row for row in rows if row.startswith("chunk_cumsum ")]
    assert kernel.endswith(f"implemented {entry.bytes_moved(small) / 1e9:.3g}-{entry.bytes_moved(large) / 1e9:.3g} "
                           f"{entry.flops(small) / 1e9:.3g}-{entry.flops(large) / 1e9:.3g}")


def test_at_80_columns_every_name_is_shown_whole(capsys, monkeypatch):
    """`list` at COLUMNS=80 cut names to "chunk_cu…"; now the name columns never wrap and the others give way
    (what a kernel replaces is left out below 120 columns)."""
    from mamba2_kernels import registry, suites

    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    words = set(out.replace("│", " ").split())
    assert {e.name for e in registry.ENTRIES} <= words
    assert {s.name for s in suites.load().suite("default")} <= words
    assert "what each replaces: at 120 columns or more" in out
