"""The pure planning and selection logic of the autotune run (mamba2_guard.core.tuneplan)."""

from __future__ import annotations

import json
import random

import pytest

from mamba2_guard.core import tuneplan
from mamba2_guard.core.tuneplan import Criteria, decide, isolate_candidates

BASE = [1.00 + 0.002 * (i % 9) for i in range(30)]


def scaled(factor, samples=BASE):
    return [x * factor for x in samples]


def launch(candidate, incumbent=BASE, kind="committed", ok=True, config=None):
    return {"kernel": "k", "key": "tokens=1", "config": config or {"num_warps": 8}, "incumbent": kind,
            "incumbent_config": {"num_warps": 4}, "precision": {"ok": ok, "detail": "rel err 1e-1"},
            "samples_ms": {"incumbent": incumbent, "candidate": candidate}}


def test_plan_is_shape_major_and_deduplicated():
    jobs = tuneplan.plan_jobs(["a", "b", "a"], ["s1", "s2"])
    assert [j.id for j in jobs] == ["a@s1", "b@s1", "a@s2", "b@s2"]
    assert [j.index for j in jobs] == [0, 1, 2, 3]


@pytest.mark.parametrize("workers", range(1, 9))
def test_assignment_is_deterministic_and_complete(workers):
    jobs = tuneplan.plan_jobs([f"k{i}" for i in range(5)], ["s1", "s2", "s3"])
    shards = tuneplan.assign(jobs, workers)
    assert len(shards) == workers
    assert sorted(j.id for s in shards for j in s) == sorted(j.id for j in jobs)
    assert shards == tuneplan.assign(list(reversed(jobs)), workers)  # order of the input does not matter
    for w, shard in enumerate(shards):
        assert all(j.index % workers == w for j in shard)
        assert [j.index for j in shard] == sorted(j.index for j in shard)


@pytest.mark.parametrize("workers", range(1, 9))
def test_merge_equals_sequential_whatever_the_completion_order(workers):
    jobs = tuneplan.plan_jobs(["a", "b", "c"], ["s1", "s2"])
    order = {j.id: j.index for j in jobs}

    def entry(job):  # jobs a and b both launch the shared kernel "k" at the same key: first job must win
        return {"job": job.id, "status": "ok", "launches": [
            {"kernel": "k", "key": f"s={job.shape}", "config": {"by": job.id}, "decision": {"keep": True}},
            {"kernel": job.kernel, "key": f"s={job.shape}", "config": {"w": job.index},
             "decision": {"keep": job.index % 3 != 2}}]}

    sequential = tuneplan.merge({"old": {"x": {"w": 1}}}, tuneplan.accepted([entry(j) for j in jobs], order))
    rng = random.Random(workers)
    finished = [entry(j) for shard in tuneplan.assign(jobs, workers) for j in shard]
    rng.shuffle(finished)
    assert tuneplan.merge({"old": {"x": {"w": 1}}}, tuneplan.accepted(finished, order)) == sequential
    assert sequential["k"]["s=s1"] == {"by": "a@s1"}
    assert "c" not in sequential or "s=s1" not in sequential["c"]  # job index 2 rejected


def test_journal_skips_torn_lines_and_resume_never_redoes_finished_jobs():
    jobs = tuneplan.plan_jobs(["a", "b", "c"], ["s"])
    text = "\n".join([json.dumps({"job": "a@s", "status": "ok"}), json.dumps({"job": "b@s", "status": "failed"}),
                      '{"job": "c@s", "stat'])  # a kill during the append
    entries = tuneplan.parse_journal(text)
    assert [e["job"] for e in entries] == ["a@s", "b@s"]
    assert [j.id for j in tuneplan.pending(jobs, entries, max_attempts=2)] == ["b@s", "c@s"]
    entries.append({"job": "b@s", "status": "failed"})
    assert [j.id for j in tuneplan.pending(jobs, entries, max_attempts=2)] == ["c@s"]
    # A later failure never hides an earlier success.
    entries.append({"job": "a@s", "status": "failed"})
    assert tuneplan.latest_by_job(entries)["a@s"]["status"] == "ok"


def test_keep_a_clearly_faster_winner():
    d = decide(launch(scaled(0.9)))
    assert d.keep and d.effect == pytest.approx(-0.1, abs=0.01) and d.p_value < 0.01


@pytest.mark.parametrize("factor", [1.10, 1.0, 0.99])
def test_never_ship_a_slower_equal_or_marginal_winner(factor):
    d = decide(launch(scaled(factor)))
    assert not d.keep, d


def test_noisy_win_is_rejected():
    rng = random.Random(0)
    incumbent = [1.0 + rng.uniform(0, 0.5) for _ in range(12)]
    candidate = [0.95 + rng.uniform(0, 0.5) for _ in range(12)]
    d = decide(launch(candidate, incumbent))
    assert not d.keep and ("significant" in d.reason or "margin" in d.reason or "bound" in d.reason)


def test_precision_failure_and_errors_are_rejected():
    assert not decide(launch(scaled(0.5), ok=False)).keep
    assert "precision" in decide(launch(scaled(0.5), ok=False)).reason
    assert not decide({**launch(scaled(0.5)), "error": "boom"}).keep
    assert not decide({**launch(scaled(0.5)), "config": None}).keep
    assert not decide(launch(scaled(0.5), config={"num_warps": 4})).keep  # the committed config itself


def test_a_committed_config_that_fails_precision_now_is_replaced_by_a_passing_winner_however_slow():
    wrong = {"ok": False, "detail": "dx: rel err 3e-1"}
    for kind in ("committed", "nearest"):
        d = decide({**launch(scaled(1.3), kind=kind), "incumbent_precision": wrong})
        assert d.keep and "fails precision" in d.reason and "dx" in d.reason and d.effect > 0.2
    no_samples = {**launch(scaled(1.3)), "incumbent_precision": wrong, "samples_ms": {}}
    assert decide(no_samples).keep  # a correct config needs no timing to beat a wrong one
    # ... but never by a winner that fails too, and a passing incumbent is judged on speed as before.
    assert not decide({**launch(scaled(0.5), ok=False), "incumbent_precision": wrong}).keep
    assert not decide({**launch(scaled(1.3)), "incumbent_precision": {"ok": True}}).keep


def test_too_few_samples_cannot_show_a_speedup():
    assert not decide(launch(scaled(0.5, BASE[:4]), BASE[:4])).keep


def test_against_the_default_config_no_slower_is_enough():
    assert decide(launch(scaled(1.0), kind="default")).keep
    lost = decide(launch(scaled(1.01), kind="default"))
    assert not lost.keep and lost.store_default
    assert not decide(launch(scaled(1.01))).store_default  # a committed incumbent stays as it is


def test_a_default_that_beat_the_search_is_stored_as_the_tuned_config():
    order = {"a@s": 0}
    lost = {**launch(scaled(1.05), kind="default"), "incumbent_config": {"num_warps": 4, "block_sizes": [32]}}
    entry = {"job": "a@s", "status": "ok", "launches": [{**lost, "decision": decide(lost).to_dict()}]}
    assert [(a.key, a.config) for a in tuneplan.accepted([entry], order)] == [
        ("tokens=1", {"num_warps": 4, "block_sizes": [32]})]
    failed = {**lost, "precision": {"ok": False, "detail": "x"}}
    entry["launches"] = [{**failed, "decision": decide(failed).to_dict()}]
    assert tuneplan.accepted([entry], order) == []  # no measured comparison, nothing stored


def test_a_nearest_incumbent_that_stays_is_pinned_under_its_own_key():
    # Otherwise the key follows its neighbour's config, which the same run may replace.
    order = {"a@s": 0}
    neighbours = {"num_warps": 8, "block_sizes": [64]}

    def stored(**launch_fields):
        entry = {"job": "a@s", "status": "ok", "launches": [launch_fields]}
        return [(a.key, a.config) for a in tuneplan.accepted([entry], order)]

    rejected = {**launch(scaled(1.0), kind="nearest"), "incumbent_config": neighbours}
    assert stored(**rejected, decision=decide(rejected).to_dict()) == [("tokens=1", neighbours)]
    failed = {**rejected, "config": None, "error": "NoConfigFound: none", "samples_ms": {}}
    assert stored(**failed, decision=decide(failed).to_dict()) == [("tokens=1", neighbours)]
    checked = {**failed, "incumbent_precision": {"ok": True}}
    assert stored(**checked, decision=decide(checked).to_dict()) == [("tokens=1", neighbours)]
    wrong = {**failed, "incumbent_precision": {"ok": False, "detail": "dx: rel err 3e-1"}}
    assert stored(**wrong, decision=decide(wrong).to_dict()) == []  # not written where it computes wrong
    kept = {**launch(scaled(0.5), kind="nearest"), "incumbent_config": neighbours}
    assert stored(**kept, decision=decide(kept).to_dict()) == [("tokens=1", kept["config"])]
    committed = {**rejected, "incumbent": "committed"}
    assert stored(**committed, decision=decide(committed).to_dict()) == []  # already under its key
    unsearched = {**rejected, "config": None}
    assert stored(**unsearched, decision={}) == []  # never reached a search: not this run's slot


def test_margin_is_configurable_and_validated():
    assert decide(launch(scaled(0.97)), Criteria(margin=0.02)).keep
    assert not decide(launch(scaled(0.97)), Criteria(margin=0.05)).keep
    with pytest.raises(ValueError, match="margin"):
        Criteria(margin=-0.1)


def test_summary_counts():
    jobs = tuneplan.plan_jobs(["a", "b", "c"], ["s"])
    entries = [{"job": "a@s", "status": "ok", "launches": [{"decision": {"keep": True}}, {"decision": {}}]},
               {"job": "b@s", "status": "failed"}]
    s = tuneplan.summary(jobs, entries)
    assert (s["ok"], s["failed"], s["not_run"], s["kept"], s["rejected"]) == (1, 1, 1, 1, 1)


def test_later_jobs_skip_launches_that_finished_jobs_tuned():
    def launch(kernel, key, config=True, error=None):
        return {"kernel": kernel, "key": key, "config": {"block_sizes": [16]} if config else None, "error": error}

    entries = [
        {"job": "a@s", "status": "ok", "launches": [launch("k", "x"), launch("k2", "y", config=False),
                                                    launch("k4", "w", config=False, error="NoConfigFound")]},
        {"job": "b@s", "status": "failed"},
        {"job": "c@s", "status": "ok", "launches": [launch("k", "x"), launch("k3", "z")]},
    ]
    # Launches the tuner searched count, whatever the keep decision: with a winner, or a search that
    # failed (k4: it would fail again); k2 never reached a search.
    assert tuneplan.tuned_launches(entries) == [["k", "x"], ["k3", "z"], ["k4", "w"]]
    assert tuneplan.tuned_launches([]) == []


def test_a_slot_belongs_to_the_first_job_that_tuned_it_even_when_it_rejected_its_winner():
    # Sequentially the whole-call job would skip k (tuned by the kernel's own job); on several GPUs it may
    # tune k too and keep a winner. Either way the configs must come out the same: the kernel job's "no".
    order = {"kernel@s": 0, "call@s": 1}
    kernel_job = {"job": "kernel@s", "status": "ok", "launches": [
        {"kernel": "k", "key": "x", "config": {"w": 1}, "decision": {"keep": False}}]}
    call_skipped = {"job": "call@s", "status": "ok", "launches": [], "tuned_elsewhere": [["k", "x"]]}
    call_tuned = {"job": "call@s", "status": "ok", "launches": [
        {"kernel": "k", "key": "x", "config": {"w": 2}, "decision": {"keep": True}}]}
    assert tuneplan.accepted([kernel_job, call_skipped], order) == []
    assert tuneplan.accepted([call_tuned, kernel_job], order) == []
    assert [a.config for a in tuneplan.accepted([call_tuned], order)] == [{"w": 2}]  # alone, it owns k
    # A kernel job whose search failed owns the slot too: sequentially the whole call skips it.
    failed_search = {"job": "kernel@s", "status": "ok", "launches": [
        {"kernel": "k", "key": "x", "config": None, "error": "NoConfigFound", "decision": {"keep": False}}]}
    assert tuneplan.accepted([call_tuned, failed_search], order) == []


def test_assignment_by_known_cost_puts_the_longest_jobs_on_different_workers():
    jobs = tuneplan.plan_jobs([f"k{i}" for i in range(6)], ["s"])  # k0..k5 at index 0..5
    cost = {"k0@s": 30.0, "k2@s": 19.0, "k4@s": 9.0, "k1@s": 1.0, "k3@s": 1.0}  # k5 unknown: counts as median
    shards = tuneplan.assign(jobs, 2, cost)
    assert shards == tuneplan.assign(list(reversed(jobs)), 2, cost)  # input order does not matter
    # 30 | 19, then 9 (k4) and 9 (k5, the median) to the lighter side, then the two 1s: 32 against 37
    assert [[j.id for j in s] for s in shards] == [["k0@s", "k1@s", "k3@s"], ["k2@s", "k4@s", "k5@s"]]
    assert [[j.index for j in s] for s in tuneplan.assign(jobs, 2)] == [[0, 2, 4], [1, 3, 5]]  # round-robin
    assert tuneplan.assign(jobs, 2, {}) == tuneplan.assign(jobs, 2)  # no known cost: round-robin
    assert sorted(j.index for s in tuneplan.assign(jobs, 4, cost) for j in s) == list(range(6))


@pytest.mark.parametrize("cost", [None, {"k@s0": 5.0, "k@s1": 1.0}])
def test_the_jobs_at_the_shapes_named_first_start_first_on_their_workers(cost):
    jobs = tuneplan.plan_jobs(["k", "m"], ["s0", "s1", "s2"])
    (alone,) = tuneplan.assign(jobs, 1, cost, first=["s2", "s1"])
    assert [j.id for j in alone] == ["k@s2", "m@s2", "k@s1", "m@s1", "k@s0", "m@s0"]
    plain = tuneplan.assign(jobs, 2, cost)
    named = tuneplan.assign(jobs, 2, cost, first=["s2"])
    assert [sorted(j.id for j in s) for s in named] == [sorted(j.id for j in s) for s in plain]  # same split
    for shard in named:  # on each worker its s2 jobs first, the others in plan order after them
        assert [j.index for j in shard] == sorted((j.index for j in shard), key=lambda i: (jobs[i].shape != "s2", i))


def test_only_a_job_that_crashed_or_hung_isolates_its_candidates_next_time():
    entries = [{"job": "a@s", "status": "failed", "reason": "crash"},
               {"job": "b@s", "status": "failed", "reason": "timeout"},
               {"job": "c@s", "status": "ok"},
               {"job": "d@s", "status": "failed", "reason": "no result"}]
    assert [job for job in ("a@s", "b@s", "c@s", "d@s", "e@s") if isolate_candidates(job, entries)] == [
        "a@s", "b@s"]
    # An attempt that named the launch it was searching isolates that launch alone next time.
    entries.append({"job": "f@s", "status": "failed", "reason": "crash", "in_flight": ["scan", "tokens=1"]})
    entries.append({"job": "f@s", "status": "failed", "reason": "timeout", "in_flight": ["dx", "tokens=1"]})
    assert not isolate_candidates("f@s", entries)
    assert tuneplan.isolated_launches("f@s", entries) == [["dx", "tokens=1"], ["scan", "tokens=1"]]
    assert tuneplan.isolated_launches("a@s", entries) == []


def test_failed_searches_name_the_kernel_key_and_error_of_the_last_attempts():
    entries = [
        {"job": "a@s", "status": "ok", "launches": [
            {"kernel": "norm_bwd", "key": "tokens=1", "config": None, "error": "NoConfigFound: No working config"},
            {"kernel": "dx", "key": "tokens=1", "config": {"w": 1}, "error": "validation: TypeError: bad"},
            {"kernel": "ok", "key": "tokens=1", "config": {"w": 1}}]},
        {"job": "b@s", "status": "ok", "launches": [{"kernel": "scan", "key": "tokens=2", "error": "Boom: x"}]},
        {"job": "b@s", "status": "failed", "reason": "crash"},  # an ok attempt stays the last one
        {"job": "c@s", "status": "failed", "reason": "crash"},
    ]
    assert tuneplan.failed_searches(entries) == [
        "dx[tokens=1]: validation", "norm_bwd[tokens=1]: NoConfigFound", "scan[tokens=2]: Boom"]


def test_searches_go_costliest_first_and_unknown_times_last():
    assert tuneplan.search_order([0.1, 0.4, float("nan"), 0.4, 0.2]) == [1, 3, 4, 0, 2]
    assert tuneplan.search_order([]) == []


def test_a_small_launch_of_a_code_searched_earlier_in_the_run_is_minor():
    def code(key: str) -> tuple:  # the key's fields but its sizes, as config_store.ShapeKey.code
        return tuple(part for part in key.split(",") if not part.startswith("tokens="))

    slots = [("scan", "q=64,tokens=2"), ("cumsum", "q=64,tokens=2"), ("cumsum", "q=128,tokens=2"),
             ("bmm", "q=64,tokens=2")]
    searched = [["cumsum", "q=64,tokens=1"], ["bmm", "q=64,tokens=1"], ["scan", "q=64,tokens=1"]]
    # 5 % of 1.0 ms: the cumsum at q=64 (0.01) is minor; at q=128 no search covered its code; bmm (0.06) is
    # not small enough; scan is the call
    assert tuneplan.minor_launches(slots, [0.91, 0.01, 0.02, 0.06], searched, code) == [1]
    assert tuneplan.minor_launches(slots, [0.91, 0.01, 0.02, 0.06], [], code) == []  # the run's first search
    assert tuneplan.minor_launches(slots, [0.91, float("nan"), 0.02, 0.06], searched, code) == []  # times unknown
    assert tuneplan.minor_launches([], [], searched, code) == []


def test_a_launch_gets_its_share_of_the_time_left():
    # 60 s left over launches of 0.3, 0.2 and 0.1 ms per call: half of it for the first
    assert tuneplan.launch_budget(60.0, [0.3, 0.2, 0.1]) == 30
    assert tuneplan.launch_budget(60.0, [0.1]) == 60
    # a cheap launch still gets the floor, and so does one searched after the deadline
    assert tuneplan.launch_budget(60.0, [0.01, 0.99]) == 20
    assert tuneplan.launch_budget(-5.0, [0.5, 0.5], floor=7) == 7


def test_a_launch_that_would_outlast_the_jobs_timeout_is_deferred_unless_it_is_the_attempts_first():
    check = tuneplan.LAUNCH_CHECK_SECONDS
    assert not tuneplan.defers(elapsed=100, search_seconds=20, timeout=150 + check, searched=3)
    assert tuneplan.defers(elapsed=100, search_seconds=20, timeout=119 + check, searched=3)
    assert not tuneplan.defers(elapsed=500, search_seconds=20, timeout=119 + check, searched=0)
    assert not tuneplan.defers(elapsed=500, search_seconds=20, timeout=None, searched=3)


def test_an_attempts_launches_end_by_the_jobs_timeout_or_the_runs_budget_left_whichever_is_sooner():
    assert tuneplan.attempt_limit(600, 200.5) == 200.5
    assert tuneplan.attempt_limit(150, 200) == 150
    assert tuneplan.attempt_limit(None, 90) == 90 and tuneplan.attempt_limit(600, None) == 600
    assert tuneplan.attempt_limit(None, None) is None


@pytest.mark.parametrize("times", [[float("nan"), 0.2, 0.2], [0.0, 0.0, 0.0]])
def test_without_times_the_budget_is_split_evenly(times):
    assert tuneplan.launch_budget(90.0, times) == 30


def test_a_budget_for_no_launch_is_an_error():
    with pytest.raises(ValueError, match="at least one launch"):
        tuneplan.launch_budget(10.0, [])


def test_a_seed_launches_the_innermost_tiles_first():
    """On the H200 Helion's search had kept the default loop order, in which a chunk's row blocks are
    launched thousands of programs apart, in every stored config; they ran up to 15 % faster with them
    adjacent."""
    config = {"block_sizes": [64, 64], "loop_orders": [[0, 1, 2, 3, 4]], "num_warps": 4}
    seed = tuneplan.innermost_first(config)
    assert seed == {"block_sizes": [64, 64], "loop_orders": [[4, 3, 2, 1, 0]], "num_warps": 4}
    assert config["loop_orders"] == [[0, 1, 2, 3, 4]]  # not changed in place
    assert tuneplan.innermost_first({"loop_orders": [[1, 0, 2], [0]]})["loop_orders"] == [[2, 1, 0], [0]]
    for nothing_to_flip in ({"loop_orders": [[4, 3, 2, 1, 0]]}, {"loop_orders": [[0]]}, {"loop_orders": []},
                            {"block_sizes": [8]}):
        assert tuneplan.innermost_first(nothing_to_flip) is None


def test_every_autotune_setting_has_one_range_wherever_it_is_given(tmp_path):
    from mamba2_guard.flows.autotune import AutotuneOptions
    from mamba2_guard.flows.bringup import BringUpOptions

    assert tuneplan.setting_problem("rounds", 2) is None and tuneplan.setting_problem("seed", None) is None
    assert tuneplan.setting_problem("rounds", 1) == "expected a finite number >= 2, got 1"
    assert tuneplan.setting_problem("budget_seconds", True) is not None  # a YAML boolean is no number
    base = dict(kernels=["chunk_cumsum"], shapes=["smoke"], out=tmp_path / "c.yaml", state_dir=tmp_path,
                gpu_slug="g")
    with pytest.raises(ValueError, match=r"budget_seconds: expected a finite number > 0, got inf"):
        AutotuneOptions(**base, budget_seconds=float("inf"))
    with pytest.raises(ValueError, match=r"job_budget_seconds: expected a finite number > 0, got 0"):
        BringUpOptions(state_dir=tmp_path, gpu_slug="g", budget_seconds=60, job_budget_seconds=0)


def test_a_jobs_expected_time_is_its_own_else_its_kernels_never_below_its_budget():
    job = tuneplan.Job(0, "ssd_combined_fwd_bwd", "nemotron-h-47b")
    cost = {"ssd_combined_fwd_bwd@long-context": 325.0, "ssd_combined_fwd_bwd@bamba-9b": 200.0,
            "chunk_scan@nemotron-h-47b": 900.0}
    assert tuneplan.expected_seconds(job, cost, 120) == 262.5  # the median of the kernel's other jobs
    assert tuneplan.expected_seconds(job, {**cost, job.id: 150.0}, 120) == 150.0  # its own time first
    assert tuneplan.expected_seconds(job, {"chunk_scan@long-context": 900.0}, 120) == 120  # no job of its kernel
    assert tuneplan.expected_seconds(job, {job.id: 30.0}, 120) == 120  # never less than the budget


def test_a_job_that_deferred_launches_is_expected_to_take_only_those():
    job = tuneplan.Job(0, "ssd_combined_fwd_bwd", "nemotron-h-47b")
    launch = {"tune_seconds": 21.0, "precision_seconds": 2.0, "timing_seconds": 1.0}
    last = {"job": job.id, "status": "ok", "seconds": 317.0, "setup_seconds": 34.0,
            "launches": [launch, {**launch, "precision_seconds": 44.0}, {**launch, "incumbent_precision_seconds": 3.0}],
            "deferred": [["bmm_chunk_bwd", "k=256"], ["bmm_chunk", "k=256"]]}
    cost = {job.id: 317.0}
    assert tuneplan.expected_seconds(job, cost, 120, last) == 34.0 + 2 * 27.0  # set-up + 2 x the median launch
    assert tuneplan.expected_seconds(job, cost, 120, {**last, "deferred": []}) == 317.0  # finished: its own time


def test_a_job_a_run_of_the_same_search_identity_finished_is_expected_to_take_its_set_up():
    # A guard upgrade that changed host code alone: the bring-up's new run records its finished jobs' calls and
    # searches none of their launches. Expected at their whole times (281-325 s on the H100), a night's last
    # minutes started none of them, nor anything after them.
    job = tuneplan.Job(0, "ssd_combined_fwd_bwd", "long-context")
    before = {"job": job.id, "status": "ok", "seconds": 281.5, "setup_seconds": 22.2, "launches": [{"config": {}}]}
    cost = tuneplan.job_seconds([[before]])
    assert tuneplan.expected_seconds(job, cost, 120, None, before) == 22.2
    assert tuneplan.expected_seconds(job, cost, 120, None, {**before, "deferred": [["k", "x"]]}) == 281.5
    assert tuneplan.expected_seconds(job, cost, 120, None, {**before, "status": "failed"}) == 281.5
    tried = {**before, "seconds": 30.0, "launches": [], "tuned_elsewhere": [["k", "x"]]}
    assert tuneplan.expected_seconds(job, cost, 120, tried, before) == 281.5  # tried in this run: as before
    assert tuneplan.job_seconds([[before, tried]]) == {job.id: 281.5}  # searching nothing tells no job's time
