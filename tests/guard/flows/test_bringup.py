"""A new GPU's bring-up with a fake tuner and the real journal, state directory, config file and git remote:
the stage order, the resume after a budget or a kill, a borrowed config that fails here, the PR updated as
stages land, the withheld-file mode, and the console script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mamba2_guard import config as guard_config
from mamba2_guard.adapters import fingerprint
from mamba2_guard.core import bringup, tuneplan
from mamba2_guard.core.results import BenchResult, CaseResult, SamplesMs
from mamba2_guard.flows import bringup as flow
from mamba2_guard.flows import pr as prflow
from mamba2_kernels import config_store

FAKE = str(Path(__file__).with_name("fake_tuner.py")) + ":tune"
ROOT = Path(__file__).resolve().parents[3]
SLUG = "fake-gpu"
BASE = [1.00 + 0.001 * (i % 7) for i in range(30)]  # Helion's default config, as fake_tuner.py times it
FASTER = [0.9 * x for x in BASE]


def stages(other_files: bool = True, shapes=("smoke", "mamba2-default"), tuned: bool = False) -> list[bringup.Stage]:
    plan = bringup.plan(whole_call="ssd_combined_fwd_bwd", suite_kernels=["chunk_cumsum"], suite_shapes=shapes,
                        zoo_shapes=[], grid_shapes=shapes, weight={"mamba2-default": 2.0, "smoke": 1.0},
                        other_files=other_files, tuned_before=tuned)
    return [s for s in plan if s.name != bringup.FIT]  # the fit stage has its own test


def options(tmp_path: Path, **kw) -> flow.BringUpOptions:
    defaults = dict(state_dir=tmp_path / "state", gpu_slug=SLUG, budget_seconds=600, out=tmp_path / f"{SLUG}.yaml",
                    fingerprint={"gpu_name": "Fake GPU", "helion": "9.9"}, fingerprint_digest="d" * 64,
                    job_budget_seconds=1, tuner=FAKE, stages=stages(), tuning={"rounds": 30})
    defaults.update(kw)
    return flow.BringUpOptions(**defaults)


def launch(kernel: str, key: str, ok: bool = True, faster: bool = True) -> dict:
    return {"kernel": kernel, "key": key, "config": {"block_sizes": [64], "num_warps": 4}, "incumbent": "default",
            "incumbent_config": {"block_sizes": [16], "num_warps": 2}, "precision": {"ok": ok, "detail": "dx"},
            "samples_ms": {"incumbent": BASE, "candidate": FASTER if faster else [1.2 * x for x in BASE]}}


def bench_case(shape: str, speedup: float) -> CaseResult:
    """A night's bench of the whole call at ``shape``, ``speedup`` times faster than mamba-ssm's."""
    return CaseResult(kernel="ssd_combined_fwd_bwd", shape=shape, phase="fwd_bwd",
                      samples_ms=SamplesMs(helion=BASE, mamba_ssm=[speedup * x for x in BASE]))


def paths_timed(shape: str, stage: str, fused_ms: float, chain_ms: float, *, chunk_size: int, state: int,
                heads_per_group: int) -> dict:
    """A job's timing of the whole call with ``stage`` fused and chained (``paths_on_winners``' record)."""
    return {"shape": shape, "stage": stage, "chunk_size": chunk_size, "state": state,
            "heads_per_group": heads_per_group, "ms": {"fused": fused_ms, "chain": chain_ms}}


def calls(path: Path) -> list[tuple[str, str]]:
    return [(line.split()[0], line.split()[3]) for line in path.read_text().splitlines()]


def test_the_stages_run_in_order_of_value_and_each_searches_what_it_should(tmp_path, monkeypatch):
    record = tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_TUNE_CALLS", str(record))
    outcome = flow.run_bring_up(options(tmp_path), lambda m: None)
    assert outcome.complete and outcome.stopped is None
    assert calls(record) == [
        ("ssd_combined_fwd_bwd@mamba2-default", "borrowed"), ("ssd_combined_fwd_bwd@smoke", "borrowed"),
        ("ssd_combined_fwd_bwd@mamba2-default", "helion"), ("ssd_combined_fwd_bwd@smoke", "helion"),
        ("chunk_cumsum@smoke", "helion"), ("chunk_cumsum@mamba2-default", "helion")]
    plans = {json.loads(Path(run["run_dir"], "plan.json").read_text()).get("search", "helion"): run
             for run in outcome.runs}
    assert set(plans) == {"borrowed", "helion"}
    state = flow.load_state(tmp_path / "state", SLUG)
    assert {name: s["status"] for name, s in state["stages"].items()} == {
        "borrow": "done", "hot": "done", "suite": "done", "grid": "skipped"}
    assert set(config_store.load(tmp_path / f"{SLUG}.yaml").kernels) == {"ssd_combined_fwd_bwd_k", "chunk_cumsum_k"}


def test_the_searches_start_with_the_calls_the_nights_bench_measured_below_mamba_ssms(tmp_path, monkeypatch):
    """mamba2-default outreaches smoke, but smoke measured 0.9x: every stage's search starts with it. The
    runs' plans keep the order of reach, so their ids and journals are those of a night without a bench."""
    record = tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_TUNE_CALLS", str(record))
    lines: list[str] = []
    outcome = flow.run_bring_up(options(tmp_path, call_speedups={"smoke": 0.9, "mamba2-default": 1.2}), lines.append)
    assert outcome.complete
    assert calls(record) == [
        ("ssd_combined_fwd_bwd@smoke", "borrowed"), ("ssd_combined_fwd_bwd@mamba2-default", "borrowed"),
        ("ssd_combined_fwd_bwd@smoke", "helion"), ("ssd_combined_fwd_bwd@mamba2-default", "helion"),
        ("chunk_cumsum@smoke", "helion"), ("chunk_cumsum@mamba2-default", "helion")]
    assert "stage hot: first the calls measured below mamba-ssm's: smoke (0.90x)" in lines
    hot = next(run for run in outcome.runs if run["stage"] == "hot")
    plan = json.loads(Path(hot["run_dir"], "plan.json").read_text())
    assert plan["jobs"] == ["ssd_combined_fwd_bwd@mamba2-default", "ssd_combined_fwd_bwd@smoke"]


def test_the_hot_stage_searches_the_chains_too_and_fits_a_provisional_rule_on_both_paths_timings(tmp_path,
                                                                                                  monkeypatch):
    """A new GPU runs the state passes fused until a chain rule says otherwise, and the fit stage's rule comes
    after every other stage. The hot stage's jobs search the chains' launches too and time both paths at their
    shapes; the rule fitted on those timings reaches the config file, and the PR, as the stage lands."""
    record = tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_TUNE_CALLS", str(record))

    def timed(shape: str, state: int, chain_ms: float) -> dict:
        return paths_timed(shape, "chunk_state_passing", 1.0, chain_ms, chunk_size=256, state=state,
                           heads_per_group=8)

    small, large = 1 << 16, 1 << 22
    extra = {"jobs": {"ssd_combined_fwd_bwd@smoke": {"paths": [timed("smoke", small, 0.8)]},
                      "ssd_combined_fwd_bwd@mamba2-default": {"paths": [timed("mamba2-default", large, 1.3)]}}}
    messages, updates = [], []
    outcome = flow.run_bring_up(options(tmp_path, tuning={"extra": extra}), messages.append,
                                on_configs=updates.append)
    assert outcome.complete
    searched = {(line.split()[0], line.split()[3]): line.split()[4] for line in record.read_text().splitlines()}
    chains = "chunk_state_passing=chain,chunk_state_passing_bwd=chain"
    assert searched == {("ssd_combined_fwd_bwd@mamba2-default", "borrowed"): "-",
                        ("ssd_combined_fwd_bwd@smoke", "borrowed"): "-",
                        ("ssd_combined_fwd_bwd@mamba2-default", "helion"): chains,
                        ("ssd_combined_fwd_bwd@smoke", "helion"): chains,
                        ("chunk_cumsum@smoke", "helion"): "-", ("chunk_cumsum@mamba2-default", "helion"): "-"}
    rule = config_store.load(tmp_path / f"{SLUG}.yaml").chain_rule("chunk_state_passing")
    assert rule is not None and rule.chains(256, small) and not rule.chains(256, large)
    assert any(m.startswith("provisional chunk_state_passing") for m in messages)
    assert any(m.startswith("ssd_combined_fwd_bwd@smoke (") and "chunk_state_passing fused 1.000 ms, chained "
               "0.800 ms" in m for m in messages)  # each job's line in the log says what it timed
    hot = next(run for run in outcome.runs if run["stage"] == "hot")
    assert hot["changed"] and len(updates) == 3  # borrow, hot (the rule alone: its search found nothing new), suite
    # The fit stage's rule, on the grid's timings (here: fused faster everywhere), replaces the provisional one.
    fit = next(s for s in bringup.plan(whole_call="ssd_combined_fwd_bwd", suite_kernels=[], suite_shapes=[],
                                       zoo_shapes=[], grid_shapes=["smoke"], weight={}, other_files=False)
               if s.name == bringup.FIT)

    def measure(shapes, *, out, **_):
        with out.open("a") as handle:
            handle.write(json.dumps(timed("smoke", small, 1.2)) + "\n")

    flow.run_bring_up(options(tmp_path, stages=[*stages(), fit], measure=measure), messages.append)
    assert config_store.load(tmp_path / f"{SLUG}.yaml").chain_rule("chunk_state_passing") is None


def test_a_borrowed_config_that_fails_here_is_never_stored(tmp_path):
    extra = {"search": {"borrowed": {"launches": [launch("chunk_scan", "k=1", ok=False),
                                                  launch("chunk_state", "k=1"),
                                                  launch("bmm_chunk", "k=1", faster=False)]},
                        "helion": {"launches": []}}}
    outcome = flow.run_bring_up(options(tmp_path, until="borrow", tuning={"extra": extra}), lambda m: None)
    assert outcome.stopped == "stopped after stage borrow, as asked"
    again = flow.run_bring_up(options(tmp_path, until="borrow", tuning={"extra": extra}), lambda m: None)
    assert again.runs == [] and "stopped there, as asked" in again.stopped  # no stage past --until
    kernels = config_store.load(tmp_path / f"{SLUG}.yaml").kernels
    assert "chunk_scan" not in kernels  # failed precision here: the runtime keeps its default, the search stage tries
    assert kernels["chunk_state"]["k=1"] == {"block_sizes": [64], "num_warps": 4}
    assert kernels["bmm_chunk"]["k=1"] == {"block_sizes": [16], "num_warps": 2}  # slower than the default: default


def test_a_run_stops_at_its_budget_and_a_killed_one_resumes_from_its_journal(tmp_path, monkeypatch):
    record = tmp_path / "calls.txt"
    env = dict(os.environ, FAKE_TUNE_CALLS=str(record), FAKE_TUNE_EXTRA=json.dumps({"default": {"sleep": 0.8}}),
               PYTHONPATH=str(ROOT))
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import pathlib\n"
              "from test_bringup import options\nfrom mamba2_guard.flows import bringup as flow\n"
              f"flow.run_bring_up(options(pathlib.Path({str(tmp_path)!r}), budget_seconds=600), print)\n")
    child = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not record.exists() or len(record.read_text().splitlines()) < 4):
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)  # mid-stage: the hot stage's first job finished, its second in flight
    child.wait()
    done_before = len(record.read_text().splitlines())
    assert done_before >= 4
    # A night's budget that fits one more job: the run stops and says so; the state file keeps the stage partial.
    monkeypatch.setenv("FAKE_TUNE_CALLS", str(record))
    monkeypatch.setenv("FAKE_TUNE_EXTRA", json.dumps({"default": {"sleep": 0.8}}))
    short = flow.run_bring_up(options(tmp_path, budget_seconds=1.5), lambda m: None)
    assert short.stopped and "resumes" in short.stopped and not short.complete
    assert bringup.current_stage(short.state) in ("hot", "suite")
    monkeypatch.setenv("FAKE_TUNE_EXTRA", json.dumps({"default": {}}))
    final = flow.run_bring_up(options(tmp_path), lambda m: None)
    assert final.complete
    jobs = calls(record)
    # Every job ran once, but for the one the kill cut off, which ran again: nothing finished was redone.
    assert len(set(jobs)) == 6 and len(jobs) <= 6 + 1
    # The seconds spent are the journals': the killed night's finished jobs count, its job in flight not.
    for name, stage in final.state["stages"].items():
        journal = Path(stage["run"], "journal.jsonl").read_text().splitlines() if stage.get("run") else []
        assert stage["seconds"] == round(sum(json.loads(line)["seconds"] for line in journal), 1), name
    assert final.state["stages"]["hot"]["seconds"] >= 0.8


def test_a_night_shorter_than_a_jobs_search_budget_still_resumes_the_launches_it_deferred(tmp_path):
    """A whole call's job left two launches to its next attempt when the night ended (they would outlast the
    job's timeout). The next night's budget is under the job's search budget but fits those two by the
    time the searched one took: it resumes them rather than stop before the stage."""
    first = "ssd_combined_fwd_bwd@mamba2-default"
    launches = [{**launch(kernel, "k=1"), "tune_seconds": 0.5} for kernel in ("dx", "scan", "db")]
    hot_only = dict(stages=stages(other_files=False), until="hot", job_budget_seconds=2)

    def night(budget: float, behaviour: dict) -> flow.BringUpOutcome:
        extra = {"jobs": {first: {"launches": launches, **behaviour}}}
        return flow.run_bring_up(options(tmp_path, budget_seconds=budget, tuning={"extra": extra}, **hot_only),
                                 lambda m: None)

    one = night(2.5, {"defer_after": 1, "sleep": 1.7})  # after the searched launch, too little left for the rest
    assert one.state["stages"]["hot"]["status"] == "partial"
    entries = tuneplan.parse_journal(Path(one.runs[0]["run_dir"], "journal.jsonl").read_text())
    assert [len(e.get("deferred") or []) for e in entries] == [2]
    two = night(1.5, {})
    assert two.runs, two.stopped
    entries = tuneplan.parse_journal(Path(two.runs[0]["run_dir"], "journal.jsonl").read_text())
    # one launch per attempt: with the launch's checks, two would end past the night's budget
    assert [(e["job"], [x["kernel"] for x in e["launches"]]) for e in entries] == [
        (first, ["dx"]), (first, ["scan"]), (first, ["db"])]
    assert set(config_store.load(tmp_path / f"{SLUG}.yaml").kernels) == {"dx", "scan", "db"}


def checkout_and_origin(tmp_path: Path, settings: str = "") -> tuple[Path, Path]:
    """A checkout with one commit, pushed to a real bare repository; the state dir's guard.yaml names that
    repository as the PR target (plus ``settings``). Returns (bare repository, checkout)."""
    bare, root = tmp_path / "origin.git", tmp_path / "checkout"
    subprocess.run(["git", "init", "-q", "--bare", "--initial-branch=main", str(bare)], check=True)
    subprocess.run(["git", "init", "-q", "--initial-branch=main", str(root)], check=True)
    (root / "README.md").write_text("configs\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "initial"], check=True)
    subprocess.run([*git, "push", "-q", str(bare), "main"], check=True)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "guard.yaml").write_text(f"git: {{origin: 'file://{bare}'}}\n{settings}")
    return bare, root


def test_the_config_pr_is_opened_after_the_first_stage_and_updated_as_later_ones_land(tmp_path):
    bare, root = checkout_and_origin(tmp_path)
    cfg = guard_config.load(None, tmp_path / "state")
    out = root / "mamba2_kernels" / "configs" / f"{SLUG}.yaml"
    bodies = []

    def on_configs(summary):
        pr = prflow.run_pr(tmp_path / "state", cfg, {"gpu_name": "Fake GPU"}, SLUG, root=root, bring_up=summary)
        bodies.append((pr.branch, pr.body, pr.git["status"]))

    outcome = flow.run_bring_up(options(tmp_path, out=out), lambda m: None, on_configs=on_configs, speedups=[1.1])
    assert outcome.complete
    # borrow, then suite: the fake search finds the borrowed configs again, so the hot stage changes nothing
    assert [status for _, _, status in bodies] == ["pushed", "pushed"]
    assert len({branch for branch, _, _ in bodies}) == 1  # one PR, updated in place
    assert "Bring-up stage **hot**" in bodies[0][1] and "1.10x mamba-ssm" in bodies[0][1]
    assert "Bring-up stage **complete**" in bodies[-1][1]
    branch = bodies[0][0]
    log = subprocess.run(["git", "-C", str(bare), "log", "--format=%s", branch], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert len(log) == 1 + 1  # the bot keeps one commit on its branch, rewritten with each update
    pushed = subprocess.run(["git", "-C", str(bare), "show", f"{branch}:mamba2_kernels/configs/{SLUG}.yaml"],
                            capture_output=True, text=True, check=True).stdout
    assert "chunk_cumsum_k" in pushed and "ssd_combined_fwd_bwd_k" in pushed


def test_the_fit_stage_measures_shape_by_shape_and_fits_once_all_are_in(tmp_path, monkeypatch):
    # The budget is read on a clock that only the measurements move: a slow import or a busy CI machine must not
    # decide whether the first shape fits.
    clock = [0.0]
    monkeypatch.setattr(flow.time, "monotonic", lambda: clock[0])
    fit = next(s for s in bringup.plan(whole_call="ssd_combined_fwd_bwd", suite_kernels=[], suite_shapes=[],
                                       zoo_shapes=[], grid_shapes=["smoke", "mamba2-default"], weight={},
                                       other_files=False) if s.name == bringup.FIT)
    out = tmp_path / f"{SLUG}.yaml"
    config_store.save(out, config_store.ConfigFile(kernels={"chunk_scan": {"k=1": {"num_warps": 4}}}))
    measured = []

    def measure(shapes, *, out, **_):
        measured.extend(shapes)
        clock[0] += 0.3
        with out.open("a") as handle:
            for shape in shapes:
                handle.write(json.dumps({"shape": shape, "stage": "chunk_state_passing", "chunk_size": 128,
                                         "state": 1 << 20, "ms": {"fused": 1.0, "chain": 1.5}}) + "\n")

    first = flow.run_bring_up(options(tmp_path, out=out, stages=[fit], budget_seconds=0.1, measure=measure),
                              lambda m: None)
    assert measured == ["smoke"] and not first.complete  # the budget ended after the first shape
    messages = []
    second = flow.run_bring_up(options(tmp_path, out=out, stages=[fit], measure=measure), messages.append)
    assert measured == ["smoke", "mamba2-default"]  # resumed: the measured shape was not measured again
    assert second.complete and any(m.startswith("chunk_state_passing") for m in messages)  # the fit's report


def test_the_withheld_file_mode_runs_as_a_new_gpu_that_borrows_nothing(monkeypatch):
    for name in (config_store.SLUG_ENV, config_store.BORROW_ENV):  # set, so that teardown restores what was
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert [slug for slug, _, _ in config_store.other_gpu_files("nvidia-h100")] == ["nvidia-h200"]
    assert config_store.borrowable_files("nvidia-h100", "9.0")
    slug = flow.withhold_configs()
    assert slug == "cpu-withheld" and fingerprint.gpu_slug(fingerprint.collect()) == slug
    assert config_store.other_gpu_files("nvidia-h100") == []
    assert config_store.borrowable_files("nvidia-h100", "9.0") == []
    assert flow.stages_for(slug)[0].jobs == 0  # nothing to borrow: the borrow stage is skipped
    assert flow.missing(config_store.path_for(slug))  # no file of its own: a bring-up is due


def test_the_hot_stage_reaches_the_other_kinds_of_zoo_shape_before_the_costliest_kind_is_done():
    """The zoo's costliest calls are all at chunk 128; by their time alone the first six searches would be
    theirs, and every chunk-256 shape would run on chunk-128 configs meanwhile (as the H200's withheld run did
    for its first 33 device-minutes). By reach, one of them is among the first three."""
    from mamba2_kernels import registry, suites

    loaded, call = suites.load(), registry.get(flow.WHOLE_CALL)
    hot = next(s for s in flow.stages_for("no-such-gpu") if s.name == bringup.HOT)
    chunk = {name: loaded.shapes[name].chunk_size for name in hot.shapes}
    by_time = bringup.by_reach(hot.shapes, {name: flow.roofline_ms(call, loaded.shapes[name]) for name in hot.shapes})
    assert hot.shapes[0] == by_time[0] and set(hot.shapes) == set(by_time)
    assert {chunk[name] for name in by_time[:6]} == {128}
    assert 256 in {chunk[name] for name in hot.shapes[:3]}
    # the key of a call: packing documents is one flag away; another chunk size, a tile doubling
    key = {name: flow.call_key(loaded.shapes[name]) for name in ("nemotron3-nano", "nemotron3-nano-packed",
                                                                  "mamba2-default")}
    assert key["nemotron3-nano"].distance(key["nemotron3-nano-packed"]) == 1.0
    assert key["nemotron3-nano"].distance(key["mamba2-default"]) > 2.0


def _searched(outcome: flow.BringUpOutcome) -> dict[str, dict]:
    """Each stage run's autotune plan, by stage."""
    return {run["stage"]: json.loads(Path(run["run_dir"], "plan.json").read_text())
            for run in outcome.runs if run.get("run_dir")}


def test_a_gpu_whose_file_held_configs_searches_the_fused_path_then_the_kernels_without_one(tmp_path, monkeypatch):
    """A kernel added after a GPU was tuned makes a bring-up due there (its file lacks the kernel). Its calls are
    tuned, so the hot stage searches, at the grid, only what the whole call's fused path launches without a
    config, times the fusions against their chains and fits a provisional fuse rule; then the suite stage
    searches what has no config. The state keeps how the bring-up began."""
    out = tmp_path / f"{SLUG}.yaml"
    config_store.save(out, config_store.ConfigFile(kernels={"chunk_cumsum": {"k=1": {"block_sizes": [8]}}}))
    assert flow.missing(out) and flow.tuned_before(tmp_path / "state", SLUG, out)
    monkeypatch.setattr(flow, "stages_for", lambda slug, tuned=False: stages(other_files=False, tuned=tuned))
    record = tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_TUNE_CALLS", str(record))

    def timed(shape: str, heads_per_group: int, fused_ms: float) -> dict:
        return paths_timed(shape, "chunk_scan", fused_ms, 1.0, chunk_size=128, state=1 << 16,
                           heads_per_group=heads_per_group)

    extra = {"jobs": {"ssd_combined_fwd_bwd@smoke": {"paths": [timed("smoke", 4, 0.8)]},
                      "ssd_combined_fwd_bwd@mamba2-default": {"paths": [timed("mamba2-default", 64, 1.3)]}}}
    messages = []
    outcome = flow.run_bring_up(options(tmp_path, stages=None, until="suite", tuning={"extra": extra}),
                                messages.append)
    assert outcome.state["tuned_before"] is True and outcome.state["stages"]["hot"]["status"] == "done"
    plans = _searched(outcome)
    assert set(plans) == {"hot", "suite"} and plans["hot"]["missing_only"] is True and plans["suite"]["missing_only"]
    fusions = ("chunk_bwd_db_dc=fused,chunk_cumsum_state_passing=fused,chunk_scan=fused,chunk_scan_bwd_dcb=fused,"
               "ssd_fused_fwd=fused")
    searched = {line.split()[0]: line.split()[4] for line in record.read_text().splitlines()}
    assert searched == {"ssd_combined_fwd_bwd@mamba2-default": fusions, "ssd_combined_fwd_bwd@smoke": fusions,
                        "chunk_cumsum@smoke": "-", "chunk_cumsum@mamba2-default": "-"}
    rule = config_store.load(out).fuse_rule("chunk_scan")
    assert rule is not None and rule.fuses(4) and not rule.fuses(64)
    assert any(m.startswith("provisional chunk_scan") for m in messages)


def test_a_new_gpu_searches_the_whole_call_on_every_night_of_its_bring_up(tmp_path, monkeypatch):
    """No file at the start: the hot stage searches the whole call, and still does on the nights after the first
    wrote configs (the state recorded how the bring-up began)."""
    monkeypatch.setattr(flow, "stages_for", lambda slug, tuned=False: stages(other_files=False, tuned=tuned))
    first = flow.run_bring_up(options(tmp_path, stages=None, until="borrow"), lambda m: None)
    assert first.state["tuned_before"] is False
    out = tmp_path / f"{SLUG}.yaml"
    config_store.save(out, config_store.ConfigFile(kernels={"chunk_cumsum": {"k=1": {"block_sizes": [8]}}}))
    assert not flow.tuned_before(tmp_path / "state", SLUG, out)
    later = flow.run_bring_up(options(tmp_path, stages=None, until="hot"), lambda m: None)
    assert later.state["stages"]["hot"]["status"] == "done" and "missing_only" not in _searched(later)["hot"]


def test_a_kernel_added_after_a_complete_bring_up_gets_one_of_its_own(tmp_path, monkeypatch):
    """The bring-up finished before a kernel existed (its state lists the kernels it knew); once the registry
    has one the GPU's file lacks, a bring-up is due again: a new one, searching only what has no config, with
    the finished one's state kept beside it."""
    monkeypatch.setattr(flow, "stages_for", lambda slug, tuned=False: stages(other_files=False, tuned=tuned))
    state_dir, out = tmp_path / "state", tmp_path / f"{SLUG}.yaml"
    first = flow.run_bring_up(options(tmp_path, stages=None), lambda m: None)
    assert first.complete and set(first.state["kernels"]) == flow.known_kernels()
    config_store.save(out, config_store.ConfigFile(kernels={name: {"k=1": {"block_sizes": [8]}}
                                                             for name in sorted(flow.known_kernels())[1:]}))
    assert not flow.is_due(state_dir, SLUG, out)  # a kernel it knew, left without a config: the re-tune's
    path = flow.state_path(state_dir, SLUG)
    path.write_text(json.dumps({**first.state, "kernels": sorted(flow.known_kernels())[1:]}))
    assert flow.is_due(state_dir, SLUG, out) and flow.tuned_before(state_dir, SLUG, out)
    again = flow.run_bring_up(options(tmp_path, stages=None, until="suite"), lambda m: None)
    assert again.state["tuned_before"] is True  # anew: the first began with no file
    assert set(_searched(again)) == {"hot", "suite"} and _searched(again)["hot"]["missing_only"] is True
    (kept,) = [p for p in path.parent.glob(f"{SLUG}.*.json")]
    assert json.loads(kept.read_text())["stages"] == first.state["stages"]


def test_the_console_script_runs_the_bring_up_and_says_where_it_stands(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAMBA2_GUARD")}
    env.update(MAMBA2_GUARD_TUNER=FAKE, FAKE_TUNE_EXTRA=json.dumps({"default": {"launches": []}}),
               MAMBA2_GUARD_BORROW="0")
    out = tmp_path / "new.yaml"
    cmd = [str(Path(sys.executable).with_name("mamba2-guard")), "bring-up", "--state-dir", str(tmp_path / "s"),
           "--out", str(out), "--until", "hot", "--job-seconds", "1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Bring-up stage **suite**" in done.stdout and "| borrow | skipped |" in done.stdout
    assert "stopped after stage hot, as asked" in done.stdout
    again = subprocess.run([*cmd[:-4], "--budget-minutes", "0"], env=env, capture_output=True, text=True)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "argument --budget-minutes: expected a number of minutes > 0, got '0'" in again.stderr
    broken = tmp_path / "bench.json"
    broken.write_text("{not json")
    unread = subprocess.run([*cmd, "--speedups", str(broken)], env=env, capture_output=True, text=True)
    assert unread.returncode == 2 and unread.stderr.strip().splitlines()[-1].startswith(
        f"mamba2-guard: --speedups: {broken}: not a bench result"), unread.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps(BenchResult(fingerprint={}, cases=(CaseResult("chunk_cumsum", "smoke", "fwd"),)
                                            ).to_dict()))
    unfit = subprocess.run([*cmd, "--speedups", str(other)], env=env, capture_output=True, text=True)
    assert unfit.returncode == 2 and unfit.stderr.strip().splitlines() == [
        f"mamba2-guard: --speedups: {other}: expected a bench of the whole call (ssd_combined_fwd_bwd) against "
        "mamba-ssm; it has no such case"], unfit.stderr


def test_a_nightly_on_a_gpu_without_configs_brings_it_up_and_proposes_them(tmp_path, monkeypatch):
    import torch

    from mamba2_guard.core import drift as drift_mod
    from mamba2_guard.flows import nightly

    bare, root = checkout_and_origin(tmp_path, "autotune: {total_budget_seconds: 600, bringup_job_seconds: 1}\n")
    state = tmp_path / "state"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flow, "stages_for", lambda slug, tuned=False: stages(other_files=False))
    monkeypatch.setenv("MAMBA2_GUARD_TUNER", FAKE)
    record = tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_TUNE_CALLS", str(record))
    fp = fingerprint.collect()
    report = tmp_path / "report.md"
    report.write_text("## mamba2-guard check\n")
    paths = {"report_md": str(report)}
    messages: list[str] = []
    steps = nightly.retune_or_bring_up(state, "20261205T000000Z", nightly.CycleOptions(root=str(root)),
                                       guard_config.load(None, state), fp, SLUG, drift_mod.classify(fp.to_dict(), None,
                                                                                                     None),
                                       [], [], paths, messages.append, cases=[bench_case("smoke", 0.9),
                                                                              bench_case("mamba2-default", 1.3)])
    assert "retune" not in steps  # the bring-up replaced the warm re-tune
    assert steps["bringup"]["status"] == "done" and steps["bringup"]["progress"]["stage"] == "complete"
    assert steps["pr"]["status"] == "done"
    branch = steps["pr"]["branch"]
    pushed = subprocess.run(["git", "-C", str(bare), "show", f"{branch}:mamba2_kernels/configs/{SLUG}.yaml"],
                            capture_output=True, text=True, check=True).stdout
    assert "ssd_combined_fwd_bwd_k" in pushed and "chunk_cumsum_k" in pushed
    nightly.add_bring_up_section(paths, steps["bringup"]["progress"])
    assert "## Bring-up of this GPU" in report.read_text() and "1.08x mamba-ssm" in report.read_text()
    # The bench's call below mamba-ssm's speed went first, though mamba2-default outreaches it.
    assert calls(record)[:2] == [("ssd_combined_fwd_bwd@smoke", "helion"),
                                 ("ssd_combined_fwd_bwd@mamba2-default", "helion")]
    # The next night: the bring-up is complete, so none is due (the warm re-tune takes over).
    assert not flow.is_due(state, SLUG, root / "mamba2_kernels" / "configs" / f"{SLUG}.yaml")
