"""The sharded bench on CPU: N fake workers (child processes) against the sequential run."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mamba2_guard.bench import shard
from mamba2_guard.bench.run import with_layer_shares
from mamba2_guard.bench.timing import METHOD_VERSION
from mamba2_guard.core import tuneplan
from mamba2_guard.core.results import BenchResult, load_baseline
from mamba2_guard.core.verdicts import Policy, check

from . import fake_bench

FAKE = str(Path(__file__).with_name("fake_bench.py")) + ":bench"
KERNELS = [SimpleNamespace(name=f"k{i}", phase="fwd", has_helion=True) for i in range(4)]
SHAPES = [SimpleNamespace(name=s) for s in ("s_small", "s_mid", "s_big")]
FP = {"gpu_name": "Fake GPU", "gpu_uuid": "GPU-fake-0", "gpu_index": 0, "hostname": "host", "torch": "x"}
WHERE = ("worker", "device", "gpu_index", "gpu_uuid", "gpu_name", "wall_s")


def sequential(seed: int = 0, extra: dict | None = None) -> BenchResult:
    """What one process gives: the fake bench over the whole plan, in order."""
    jobs = [j.to_dict() for j in tuneplan.plan_jobs([k.name for k in KERNELS], [s.name for s in SHAPES])]
    spec = {"jobs": jobs, "seed": seed, "device": "0", "extra": extra or {}}
    cases = list(fake_bench.bench(spec, lambda **_: None))
    return BenchResult(fingerprint=FP, cases=tuple(with_layer_shares(cases)), suite="test",
                       extra={"seed": seed, "rounds": 30, "device": "cpu", "cuda_graphs": False})


def sharded(tmp_path: Path, workers: int, extra: dict | None = None, **kw) -> BenchResult:
    devices = kw.pop("devices", [str(i) for i in range(workers)])
    return shard.run_sharded(KERNELS, SHAPES, fingerprint=FP, fingerprint_digest="d" * 64, state_dir=tmp_path,
                             suite="test", workers=workers, seed=0, progress=lambda _: None, devices=devices,
                             bench_fn=FAKE, extra=extra, **kw)


def strip(case):
    return dataclasses.replace(case, extra={k: v for k, v in case.extra.items() if k not in WHERE})


def baseline_of(result: BenchResult):
    from mamba2_guard.flows.baselines import baseline_from_result

    return load_baseline(baseline_from_result(result))


def test_assignment_is_deterministic_for_1_to_8_workers():
    jobs = tuneplan.plan_jobs([f"k{i}" for i in range(7)], [f"s{i}" for i in range(5)])
    for n in range(1, 9):
        shards = tuneplan.assign(jobs, n)
        assert shards == tuneplan.assign(list(reversed(jobs)), n)  # input order does not matter
        assert len(shards) == n
        assert sorted(j.index for s in shards for j in s) == list(range(len(jobs)))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        for w, s in enumerate(shards):
            assert all(j.index % n == w for j in s)
            assert [j.index for j in s] == sorted(j.index for j in s)


def test_workers_values():
    assert shard.resolve_workers("auto", gpus=0) == 1
    assert shard.resolve_workers("auto", gpus=8) == 8
    assert shard.resolve_workers("AUTO", gpus=2) == 2
    assert shard.resolve_workers(12, gpus=8) == 8  # capped on a GPU host
    assert shard.resolve_workers("3", gpus=0) == 3  # kept on a CPU host (interpret mode, fakes)
    for bad in (0, -1, "0", "x", "1.5", "", True):
        with pytest.raises(ValueError, match="workers"):
            shard.parse_workers(bad)


@pytest.mark.parametrize("workers", [1, 3, 5])
def test_merged_result_is_the_sequential_one(tmp_path, workers):
    slow = {"jobs": {"k1@s_mid": {"slow": 1.4}, "k3@s_small": {"slow": 1.4}}}
    baseline = baseline_of(sequential())
    seq, par = sequential(extra=slow), sharded(tmp_path, workers, extra=slow)
    assert [strip(c) for c in par.cases] == list(seq.cases)  # cases, values, order, layer shares
    v_seq, v_par = check(seq, baseline, None, Policy()), check(par, baseline, None, Policy())
    assert [v.to_dict() for v in v_par] == [v.to_dict() for v in v_seq]
    assert {v.status for v in v_par} >= {"regression"}
    split = par.extra["sharding"]
    assert split["workers"] == workers and sum(p["n_jobs"] for p in split["per_worker"]) == 12
    assert all(p["status"] == "ok" for p in split["per_worker"])
    assert split["longest_job"]["job"] in {j.id for j in tuneplan.plan_jobs(["k0", "k1", "k2", "k3"],
                                                                                ["s_small", "s_mid", "s_big"])}
    # the timing method is part of what a number means: history windows restart when it changes
    assert par.fingerprint == {**FP, "timing_method": METHOD_VERSION} and par.fingerprint_hash != seq.fingerprint_hash
    json.dumps(par.to_dict(), allow_nan=False)  # the result file writes
    assert BenchResult.from_dict(json.loads(json.dumps(par.to_dict()))).cases == par.cases


def test_crash_and_hang_cost_only_their_cases(tmp_path):
    # 4 workers over 12 jobs: worker w gets plan indices w, w+4, w+8. Index 5 = k1@s_mid (worker 1)
    # crashes; index 6 = k2@s_mid (worker 2) hangs.
    bad = {"jobs": {"k1@s_mid": {"crash": True}, "k2@s_mid": {"hang": True}}}
    seq = sequential()
    par = sharded(tmp_path, 4, extra=bad, case_timeout_s=3.0)
    jobs = tuneplan.plan_jobs([k.name for k in KERNELS], [s.name for s in SHAPES])
    errors = {j.id: c.error for j, c in zip(jobs, par.cases, strict=True) if c.error}
    assert set(errors) == {"k1@s_mid", "k1@s_big", "k2@s_mid", "k2@s_big"}  # the job and the worker's later ones
    assert "crashed" in errors["k1@s_mid"] and "SIGSEGV" in errors["k1@s_mid"]
    assert "hung" in errors["k2@s_mid"] and "while measuring" in errors["k2@s_mid"]
    assert "before this case" in errors["k2@s_big"]
    for j, c, s in zip(jobs, par.cases, seq.cases, strict=True):
        assert (c.kernel, c.shape) == (j.kernel, j.shape)
        if not c.error:  # every other case is what the sequential run measured
            assert strip(c).samples_ms == s.samples_ms and strip(c).precision == s.precision
    status = {p["worker"]: p["status"] for p in par.extra["sharding"]["per_worker"]}
    assert status == {0: "ok", 1: "crash", 2: "timeout", 3: "ok"}
    verdicts = check(par, baseline_of(seq), None, Policy())
    assert sum(v.status == "error" for v in verdicts) == 4


def test_cases_record_their_gpu_and_metrics_label_it(tmp_path, monkeypatch):
    from mamba2_guard.adapters import metrics

    par = sharded(tmp_path, 3, devices=["5", "6", "7"])
    jobs = tuneplan.plan_jobs([k.name for k in KERNELS], [s.name for s in SHAPES])
    for j, c in zip(jobs, par.cases, strict=True):
        w = j.index % 3
        assert (c.extra["worker"], c.extra["device"], c.extra["gpu_index"]) == (w, str(5 + w), 5 + w)
        assert c.extra["gpu_uuid"] == f"GPU-fake-{5 + w}"
    assert [p["gpu_uuid"] for p in par.extra["sharding"]["per_worker"]] == [f"GPU-fake-{d}" for d in (5, 6, 7)]
    m = metrics.GuardMetrics()
    m.update_from_result(par, check(par, baseline_of(sequential()), None, Policy()))
    text = m.exposition().decode()
    line = next(x for x in text.splitlines() if x.startswith("mamba2_guard_speedup_ratio{") and 'kernel="k2"' in x
                and 'shape="s_small"' in x)  # plan index 2 -> worker 2 -> device 7
    assert 'gpu="7"' in line and 'UUID="GPU-fake-7"' in line
    for family in ("mamba2_guard_case_status{", "mamba2_guard_regression{", "mamba2_guard_kernel_latency_seconds{"):
        lines = [x for x in text.splitlines() if x.startswith(family) and 'kernel="k1"' in x and 's_small' in x]
        assert lines and all('UUID="GPU-fake-6"' in x for x in lines), family
    pushed = {}
    monkeypatch.setattr("prometheus_client.push_to_gateway", lambda url, **kw: pushed.update(kw))
    m.push("http://gw", "mamba2-guard")
    assert "gpu" not in pushed["grouping_key"]  # series of several GPUs: grouped by host only


def test_confirmation_reruns_on_the_measuring_gpu(tmp_path, monkeypatch):
    from mamba2_guard.flows.check import run_check

    baseline = baseline_of(sequential())
    # through the environment, so the confirming worker (a new child) is as slow as the first
    monkeypatch.setenv("FAKE_BENCH_EXTRA", json.dumps({"jobs": {"k1@s_mid": {"slow": 1.4}}}))
    par = sharded(tmp_path, 3, devices=["0", "1", "2"])
    rerun = shard.rerun_on_measuring_gpu(par, state_dir=tmp_path, seed=0, rounds=30, cuda_graphs=False,
                                         fingerprint_digest="d" * 64, progress=lambda _: None, bench_fn=FAKE)
    assert rerun is not None
    result, verdicts = run_check(par, baseline, None, Policy(), rerun)
    case = result.case("k1", "s_mid")
    confirmation = case.extra["confirmation"]
    assert confirmation["extra"]["device"] == case.extra["device"] == "2"  # plan index 5 -> worker 2
    assert confirmation["extra"]["gpu_uuid"] == "GPU-fake-2" and confirmation["seed"] == 1
    assert next(v for v in verdicts if v.kernel == "k1" and v.shape == "s_mid").status == "regression"
    assert shard.rerun_on_measuring_gpu(sequential(), state_dir=tmp_path, seed=0, rounds=30, cuda_graphs=False,
                                        fingerprint_digest="d", progress=print) is None


@pytest.mark.parametrize("value", ["0", "-2", "x", "1.5", ""])
def test_cli_rejects_bad_workers(value, capsys):
    from mamba2_guard import cli

    for command in ("bench", "nightly"):
        with pytest.raises(SystemExit) as exc:
            cli.main([command, "--workers", value])
        assert exc.value.code == 2
        assert "argument --workers" in capsys.readouterr().err


def test_cli_bench_with_fake_workers(tmp_path, capsys):
    from mamba2_guard import cli
    from mamba2_kernels import registry, suites

    names = [e.name for e in registry.select(None)][:3]
    out = tmp_path / "result.json"
    code = cli.main(["bench", "--workers", "2", "--bench-fn", FAKE, "--kernels", *names, "--state-dir",
                     str(tmp_path), "--json", str(out)])
    assert code == 0
    result = BenchResult.from_dict(json.loads(out.read_text()))
    shapes = [sh.name for sh in suites.load().suite("smoke")]  # no GPU: the smoke suite
    assert [(c.shape, c.kernel) for c in result.cases] == [(sh, k) for sh in shapes for k in names]
    assert [c.extra["worker"] for c in result.cases] == [i % 2 for i in range(len(result.cases))]
    assert result.extra["sharding"]["workers"] == 2


def test_nightly_cycle_with_workers(tmp_path):
    from mamba2_guard.flows.nightly import CycleOptions, run_cycle
    from mamba2_kernels import registry

    names = [e.name for e in registry.select(None) if e.has_helion][:2]
    options = CycleOptions(kernels=names, workers=2, bench_fn=FAKE, root=str(tmp_path / "root"), pr=False,
                           update_baseline=True)
    first = run_cycle(tmp_path / "state", options, progress=lambda _: None)
    assert first.exit_code == 0 and "sharding" in first.result.extra
    assert {c.extra["gpu_uuid"] for c in first.result.cases} == {"GPU-fake-0"}  # no GPU: both workers on "0"
    saved = json.loads(Path(first.paths["result"]).read_text())
    assert saved["extra"]["sharding"]["workers"] == 2


def test_a_later_sharded_run_splits_by_the_earlier_runs_case_times(tmp_path):
    # Round-robin puts plan indexes 0 and 2 (k0 and k2 at s_small) on worker 0; they are the slow cases.
    slow = {"jobs": {"k0@s_small": {"sleep": 0.6}, "k2@s_small": {"sleep": 0.6}}}
    assert shard.previous_case_seconds(tmp_path) == ({}, None)
    first = sharded(tmp_path, 2, extra=slow).extra["sharding"]
    assert first["assignment"].startswith("round-robin")
    assert {"k0@s_small", "k2@s_small"} <= set(first["per_worker"][0]["jobs"])
    seconds, source = shard.previous_case_seconds(tmp_path)
    assert len(seconds) == 12 and seconds["k0@s_small"] >= 0.6 and source
    later = sharded(tmp_path, 2, extra=slow)
    split = later.extra["sharding"]
    assert split["assignment"].startswith("longest first") and source in split["assignment"]
    where = {job: p["worker"] for p in split["per_worker"] for job in p["jobs"]}
    assert where["k0@s_small"] != where["k2@s_small"]
    assert [strip(c) for c in later.cases] == list(sequential(extra=slow).cases)  # same result, other split


REPO = Path(__file__).resolve().parents[3]
GUARD = Path(sys.executable).parent / "mamba2-guard"


def cli_env(**extra: str) -> dict[str, str]:
    # no GPU for the child either: the split (job i -> worker i % 2) and the smoke suite are the CPU ones
    return {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", **extra}


def killed_sharded_bench(tmp_path: Path) -> tuple[list[str], list[str], BenchResult]:
    """``bench --workers 2 --json`` killed by SIGKILL once it has finished what it can: plan indexes 0, 1, 3;
    worker 0 (0, 2, 4) hangs at 2 and worker 1 (1, 3, 5) at 5. Its argv, the kernels and the file then."""
    from mamba2_kernels import registry

    names = [e.name for e in registry.select(None)][:6]
    out = tmp_path / "result.json"
    argv = ["bench", "--workers", "2", "--bench-fn", FAKE, "--kernels", *names, "--shapes", "smoke", "--json", str(out),
            "--state-dir", str(tmp_path / "state")]
    hang = {"jobs": {f"{names[2]}@smoke": {"hang": True}, f"{names[5]}@smoke": {"hang": True}}}
    run = subprocess.Popen([str(GUARD), *argv], cwd=REPO, env=cli_env(FAKE_BENCH_EXTRA=json.dumps(hang)),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while run.poll() is None and time.monotonic() < deadline:
            if out.exists() and len(json.loads(out.read_text())["cases"]) == 3:  # written atomically: never torn
                break
            time.sleep(0.05)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert out.exists(), "no --json file while the workers ran"
    return argv, names, BenchResult.from_dict(json.loads(out.read_text()))


def test_a_killed_sharded_bench_keeps_its_finished_cases_in_the_json_file(tmp_path):
    _, names, stopped = killed_sharded_bench(tmp_path)
    assert stopped.extra["partial"] == {"cases": 3, "planned": 6}, stopped.extra
    assert [c.kernel for c in stopped.cases] == [names[0], names[1], names[3]]  # plan order, over both workers
    assert [c.extra["worker"] for c in stopped.cases] == [0, 1, 1]
    assert {k: stopped.extra[k] for k in ("seed", "rounds", "cuda_graphs")} == {"seed": 0, "rounds": 30,
                                                                                 "cuda_graphs": False}


def test_resume_with_workers_measures_only_the_missing_cases(tmp_path):
    argv, names, stopped = killed_sharded_bench(tmp_path)
    ran = tmp_path / "ran.txt"
    resumed = subprocess.run([str(GUARD), *argv, "--resume"], cwd=REPO, env=cli_env(FAKE_BENCH_RAN=str(ran)),
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed: 3 of 6 case(s) measured before, 3 to go" in resumed.stderr
    assert sorted(ran.read_text().split()) == sorted(f"{names[i]}@smoke" for i in (2, 4, 5))
    final = BenchResult.from_dict(json.loads((tmp_path / "result.json").read_text()))
    assert [c.kernel for c in final.cases] == names and "partial" not in final.extra
    assert final.started_at == stopped.started_at and final.extra["sharding"]["workers"] == 2

    def measured(case):
        return dataclasses.replace(case, layer_share=None)

    assert [measured(final.cases[i]) for i in (0, 1, 3)] == [measured(c) for c in stopped.cases]
    assert sum(c.layer_share for c in final.cases) == pytest.approx(1.0)  # shares over all six cases
