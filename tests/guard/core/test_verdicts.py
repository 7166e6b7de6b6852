"""mamba2_guard.core.verdicts: the decision rule on injected samples, confirmation, precedence, exit codes."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba2_guard.core.results import BenchResult, CaseResult, Precision, SamplesMs
from mamba2_guard.core.verdicts import (
    FAILING,
    STATUSES,
    Policy,
    Verdict,
    check,
    combine,
    exit_code,
    failures_first,
    judge,
    needs_confirmation,
)

from .factories import GOOD, base_case, baseline_of, history, make_case

POLICY = Policy()


def _trials(n, seed, **case_kw):
    """(verdict, rng) for n independent nights: fresh baseline and fresh current from the same setup,
    with the current shifted by ``case_kw``."""
    rng = np.random.default_rng(seed)
    shift = {k: case_kw.pop(k) for k in ("helion_shift", "mamba_shift") if k in case_kw}
    for _ in range(n):
        base = base_case(make_case(rng, **case_kw))
        yield judge(make_case(rng, **case_kw, **shift), base, [], POLICY), rng, base, {**case_kw, **shift}


# ----------------------------------------------------------------------------------------------
# The statistical rule on simulated nights


def test_aa_quiet_at_1_percent_noise():
    tally = Counter(v.status for v, *_ in _trials(500, seed=1, noise=0.01))
    assert tally == {"ok": 500}


def test_aa_false_alarms_at_5_percent_noise():
    """With 5 % noise the rank test is the binding gate: false regressions stay <= 1 % (alpha = 0.01
    two-sided gives ~0.5 % per direction), and a confirming re-run removes nearly all of them."""
    trials = 1000
    tally: Counter = Counter()
    confirmed = 0
    for v, rng, base, kw in _trials(trials, seed=2, noise=0.05):
        tally[v.status] += 1
        if needs_confirmation(v):
            again = judge(make_case(rng, **kw), base, [], POLICY)
            confirmed += combine(v, again).status == "regression"
    assert tally["regression"] / trials <= 0.01
    assert (trials - tally["ok"]) / trials <= 0.02  # regression or faster
    assert confirmed / trials <= 0.002


def test_aa_quiet_with_clock_wander_shared_by_both():
    """Per-round clock wander (3 %) hits Helion and mamba-ssm alike: the paired ratio cancels it."""
    tally = Counter(v.status for v, *_ in _trials(300, seed=3, noise=0.01, common=0.03))
    assert tally["regression"] == 0


def test_helion_only_5_percent_shift_is_caught():
    trials = 300
    verdicts = [v for v, *_ in _trials(trials, seed=4, noise=0.01, helion_shift=1.05)]
    caught = [v for v in verdicts if v.status == "regression"]
    assert len(caught) / trials >= 0.95
    assert not any(v.environment for v in caught)  # never blamed on the environment
    assert sum(v.signal == "ratio" for v in caught) / len(caught) >= 0.9
    assert all(v.effect == pytest.approx(0.05, abs=0.02) for v in caught)


def test_small_real_shift_stays_quiet():
    """3 %: significant but below the 5 % practical threshold."""
    tally = Counter(v.status for v, *_ in _trials(200, seed=5, noise=0.01, helion_shift=1.03))
    assert tally["regression"] == 0


def test_shared_shift_is_an_environment_regression():
    trials = 200
    verdicts = [v for v, *_ in _trials(trials, seed=6, noise=0.01, helion_shift=1.06, mamba_shift=1.06)]
    assert all(v.status == "regression" and v.signal == "absolute" and v.environment for v in verdicts)
    assert "environment" in verdicts[0].detail


def test_faster():
    v = next(_trials(1, seed=7, noise=0.01, helion_shift=0.9))[0]
    assert v.status == "faster" and v.signal == "ratio" and v.effect < -0.05


def test_too_few_samples_falls_back_to_effect():
    rng = np.random.default_rng(8)
    base = base_case(make_case(rng, n=4))
    v = judge(make_case(rng, n=4, helion_shift=1.2), base, [], POLICY)
    assert v.status == "regression" and v.p_value is None
    v = judge(make_case(rng, n=4), base, [], POLICY)
    assert v.status == "ok"


def test_baseline_without_samples_uses_medians():
    rng = np.random.default_rng(9)
    base = base_case(make_case(rng))
    bare = replace(base, helion=replace(base.helion, samples_ms=()), mamba_ssm=replace(base.mamba_ssm, samples_ms=()))
    assert judge(make_case(rng, helion_shift=1.15), bare, [], POLICY).status == "regression"
    assert judge(make_case(rng), bare, [], POLICY).status == "ok"


def test_no_mamba_ssm_timing_judges_absolute_only():
    rng = np.random.default_rng(10)
    cur = make_case(rng, helion_shift=1.10)
    cur = replace(cur, samples_ms=SamplesMs(cur.samples_ms.helion, ()))
    v = judge(cur, base_case(make_case(rng)), [], POLICY)
    assert v.status == "regression" and v.signal == "absolute" and not v.environment
    assert "no paired mamba-ssm" in v.detail


# ----------------------------------------------------------------------------------------------
# Precedence


def test_precision_failure_wins_over_speed():
    rng = np.random.default_rng(11)
    base = base_case(make_case(rng))
    for bad in (replace(GOOD, allclose=False), replace(GOOD, finite=False), replace(GOOD, ok=False),
                replace(GOOD, max_rel_err_vs_fp64=5e-3)):  # 5x mamba-ssm's error vs fp64
        for shift in (0.8, 1.0, 1.3):
            v = judge(make_case(rng, helion_shift=shift, precision=bad), base, [], POLICY)
            assert v.status == "precision-fail", (bad, shift)
    # within twice mamba-ssm's error: fine
    assert judge(make_case(rng, precision=replace(GOOD, max_rel_err_vs_fp64=1.9e-3)), base, [], POLICY).status == "ok"


def test_without_mamba_ssm_the_runners_fp64_judgement_decides():
    """No peer (the layer on a runner without causal-conv1d): allclose was taken against fp64, where bf16
    outputs are held to twice PyTorch's same-dtype error instead, and the runner's ok says which held."""
    rng = np.random.default_rng(16)
    base = base_case(make_case(rng))
    peerless = replace(GOOD, allclose=False, max_abs_diff_vs_mamba_ssm=None, mean_abs_diff_vs_mamba_ssm=None,
                       mamba_ssm_max_rel_err_vs_fp64=None)
    assert judge(make_case(rng, precision=peerless), base, [], POLICY).status == "ok"
    failed = judge(make_case(rng, precision=replace(peerless, ok=False)), base, [], POLICY)
    assert failed.status == "precision-fail" and "no mamba-ssm" in failed.detail


def test_precision_growth_vs_baseline_is_opt_in():
    rng = np.random.default_rng(12)
    base = base_case(make_case(rng))
    grown = replace(GOOD, max_abs_diff_vs_mamba_ssm=0.05)
    assert judge(make_case(rng, precision=grown), base, [], POLICY).status == "ok"
    strict = Policy(precision_growth_factor=4.0)
    assert judge(make_case(rng, precision=grown), base, [], strict).status == "precision-fail"


@settings(max_examples=60, deadline=None)
@given(error=st.one_of(st.none(), st.text(min_size=1, max_size=20)), meaningful=st.booleans(),
       throttled=st.booleans(), has_baseline=st.booleans(), has_precision=st.booleans(),
       shift=st.floats(0.5, 2.0))
def test_missing_kernel_never_passes(error, meaningful, throttled, has_baseline, has_precision, shift):
    rng = np.random.default_rng(13)
    case = make_case(rng, helion_shift=shift, missing=True, error=error, timings_meaningful=meaningful,
                     throttled=throttled, precision=GOOD if has_precision else None)
    base = base_case(make_case(rng)) if has_baseline else None
    v = judge(case, base, [], POLICY)
    assert v.status == "missing-kernel" and v.failing
    assert exit_code([v]) == 1


def test_error_and_missing_precision():
    rng = np.random.default_rng(14)
    base = base_case(make_case(rng))
    v = judge(make_case(rng, error="RuntimeError: CUDA error at chunk_scan.py:10"), base, [], POLICY)
    assert v.status == "error" and "CUDA error" in v.detail
    assert judge(make_case(rng, precision=None), base, [], POLICY).status == "error"


def test_interpret_mode_judges_precision_only():
    rng = np.random.default_rng(15)
    base = base_case(make_case(rng))
    slow = make_case(rng, helion_shift=3.0, timings_meaningful=False)
    assert judge(slow, base, [], POLICY).status == "ok"
    assert judge(slow, None, [], POLICY).status == "ok"  # no baseline needed for precision
    bad = make_case(rng, timings_meaningful=False, precision=replace(GOOD, allclose=False))
    assert judge(bad, None, [], POLICY).status == "precision-fail"


def test_no_baseline_and_throttled():
    rng = np.random.default_rng(16)
    v = judge(make_case(rng), None, [], POLICY)
    assert v.status == "no-baseline" and exit_code([v]) == 0
    v = judge(make_case(rng, helion_shift=1.5, throttled=True), base_case(make_case(rng)), [], POLICY)
    assert v.status == "ok" and "throttled" in v.detail


def test_a_baseline_timed_by_another_method_is_not_compared_with():
    """After a timing change (e.g. the head start: a 10 us kernel had read as its 0.1 ms dispatch) the old
    numbers would give false verdicts: the case asks for a re-baseline instead."""
    rng = np.random.default_rng(17)
    now = {"timing_method": "eager/v2"}
    old = base_case(make_case(rng, helion_shift=5.0, extra={"timing_method": "eager/v1"}))
    v = judge(make_case(rng, extra=now), old, [], POLICY)
    assert v.status == "no-baseline" and "eager/v1, now eager/v2" in v.detail and "--update-baseline" in v.detail
    unrecorded = base_case(make_case(rng, helion_shift=5.0))
    assert "older, unrecorded" in judge(make_case(rng, extra=now), unrecorded, [], POLICY).detail
    same = base_case(make_case(rng, helion_shift=5.0, extra=now))
    assert judge(make_case(rng, extra=now), same, [], POLICY).status == "faster"
    # precision is judged whatever the timing method
    bad = make_case(rng, extra=now, precision=replace(GOOD, allclose=False))
    assert judge(bad, old, [], POLICY).status == "precision-fail"


# ----------------------------------------------------------------------------------------------
# History signal


def test_history_drift_flags_and_is_confirmed_by_persistence():
    """Speedup sliding 0.5 %/night while the baseline moves with it (no single night vs baseline
    crosses the threshold): only the history signal sees it."""
    rng = np.random.default_rng(17)
    speedups = [1.3 * (1 - 0.005 * max(0, t - 9)) * float(np.exp(rng.normal(0, 0.003))) for t in range(20)]
    window = history(speedups[:-1])
    # current run and baseline both at the last level: the nightly comparison is quiet
    level = speedups[-1]
    base = base_case(make_case(rng, mamba_ms=level))
    cur = make_case(rng, mamba_ms=level)
    v = judge(cur, base, window, POLICY)
    assert v.status == "regression" and v.signal == "history" and v.confirmed
    assert not needs_confirmation(v)
    assert v.effect > 0.03


def test_history_aa_stays_quiet():
    rng = np.random.default_rng(18)
    alarms = 0
    for _ in range(150):
        window = history([1.3 * float(np.exp(rng.normal(0, 0.01))) for _ in range(20)])
        base = base_case(make_case(rng))
        alarms += judge(make_case(rng), base, window, POLICY).status != "ok"
    assert alarms <= 1


def test_history_window_resets_on_fingerprint_change():
    rng = np.random.default_rng(19)
    old_env = history([1.5] * 15, fp="old")  # faster environment, before a driver change
    new_env = history([1.3] * 3, fp="new", start_id=16)
    base = base_case(make_case(rng))
    cur = make_case(rng)
    # Without the reset the drop 1.5 -> 1.3 would read as a drift.
    assert judge(cur, base, old_env + new_env, POLICY).signal == "history"
    v = judge(cur, base, old_env + new_env, POLICY, fingerprint_hash="new")
    assert v.status == "ok" and v.evidence["history_points"] == 3


def test_environment_drift_in_history():
    rng = np.random.default_rng(20)
    ms = [1.0 * (1 + 0.006 * max(0, t - 9)) for t in range(20)]
    window = history([1.3] * 19, helion_ms=ms[:-1])
    level = dict(helion_ms=ms[-1], mamba_ms=1.3 * ms[-1])  # both drift: the speedup holds
    base = base_case(make_case(rng, **level))
    v = judge(make_case(rng, **level), base, window, POLICY)
    assert v.status == "regression" and v.signal == "history" and v.environment
    assert "environment drift" in v.detail


# ----------------------------------------------------------------------------------------------
# Confirmation


def _regression(signal="ratio", effect=0.06, p=1e-6, env=False):
    return Verdict("k", "s", "regression", signal=signal, effect=effect, p_value=p, environment=env)


def test_combine_confirmed():
    v = combine(_regression(effect=0.07, p=1e-5), _regression(effect=0.055, p=1e-3))
    assert v.status == "regression" and v.confirmed and v.signal == "ratio"
    assert v.effect == 0.055 and v.p_value == 1e-3  # the weaker of the two
    assert not needs_confirmation(v)
    assert combine(v, Verdict("k", "s", "ok")) is v  # already confirmed: unchanged


def test_combine_mixed_signals_is_absolute():
    v = combine(_regression("ratio"), _regression("absolute", env=True))
    assert v.signal == "absolute" and v.confirmed and not v.environment
    v = combine(_regression("absolute", env=True), _regression("absolute", env=True))
    assert v.environment


def test_combine_not_confirmed_clears():
    v = combine(_regression(), Verdict("k", "s", "ok", effect=0.01, p_value=0.4))
    assert v.status == "ok" and not v.confirmed and "not confirmed" in v.detail
    assert v.evidence["first"]["status"] == "regression"


def test_combine_worse_rerun_wins():
    v = combine(_regression(), Verdict("k", "s", "precision-fail", detail="non-finite"))
    assert v.status == "precision-fail" and v.detail.startswith("on re-run")


def test_combine_mismatch_and_passthrough():
    with pytest.raises(ValueError):
        combine(_regression(), Verdict("k", "other", "ok"))
    ok = Verdict("k", "s", "ok")
    assert combine(ok, _regression()) is ok
    hist = Verdict("k", "s", "regression", signal="history", confirmed=True)
    assert not needs_confirmation(hist) and combine(hist, ok) is hist


# ----------------------------------------------------------------------------------------------
# Policy, exit codes, check


def test_policy_overrides_per_kernel_and_pattern():
    p = Policy(overrides={"noisy_*": {"threshold": 0.10}, "noisy_bwd/long": {"alpha": 0.001}})
    assert p.for_case("other", "s").threshold == 0.05
    assert p.for_case("noisy_bwd", "s").threshold == 0.10
    q = p.for_case("noisy_bwd", "long")
    assert q.threshold == 0.10 and q.alpha == 0.001 and not q.overrides
    rng = np.random.default_rng(21)
    base = base_case(make_case(rng, kernel="noisy_bwd"))
    assert judge(make_case(rng, kernel="noisy_bwd", helion_shift=1.07), base, [], p).status == "ok"
    assert judge(make_case(rng, kernel="noisy_bwd", helion_shift=1.07), base, [], Policy()).status == "regression"


def test_policy_validation_names_the_key():
    with pytest.raises(ValueError, match=r"policy\.alpha"):
        Policy(alpha=1.5)
    with pytest.raises(ValueError, match=r"policy\.thresold"):
        Policy.from_dict({"thresold": 0.1})
    with pytest.raises(ValueError, match=r"overrides\.k\.history_size"):
        Policy(overrides={"k": {"history_size": 3}})
    with pytest.raises(ValueError, match="history_rule"):
        Policy(history_rule="magic")
    p = Policy.from_dict({"alpha": 0.005, "kernels": {"k": {"threshold": 0.08}}})
    assert p.alpha == 0.005 and p.for_case("k", "s").threshold == 0.08
    assert Policy.from_dict(p.to_dict()) == p


def test_exit_codes():
    ok = Verdict("k", "a", "ok")
    assert exit_code([]) == 0
    assert exit_code([ok, Verdict("k", "b", "faster"), Verdict("k", "c", "no-baseline")]) == 0
    for status in FAILING:
        assert exit_code([ok, Verdict("k", "d", status)]) == 1
    assert exit_code([ok], usage_error=True) == 2
    assert exit_code([Verdict("k", "d", "regression")], usage_error=True) == 2


@given(st.lists(st.sampled_from(STATUSES), max_size=12))
def test_exit_code_is_1_iff_something_fails(statuses):
    vs = [Verdict("k", str(i), s) for i, s in enumerate(statuses)]
    assert exit_code(vs) == (1 if set(statuses) & FAILING else 0)
    ordered = failures_first(vs)
    ranks = [0 if v.status in FAILING else 1 for v in ordered]
    assert ranks == sorted(ranks)


def test_verdict_round_trip_and_validation():
    v = _regression()
    assert Verdict.from_dict(v.to_dict()) == v
    with pytest.raises(ValueError):
        Verdict("k", "s", "bad-status")
    with pytest.raises(ValueError):
        Verdict("k", "s", "ok", signal="vibes")


def test_check_over_a_result():
    rng = np.random.default_rng(22)
    cases = (make_case(rng, kernel="a"), make_case(rng, kernel="b"), make_case(rng, kernel="c"))
    baseline = baseline_of(cases[0], cases[1])
    cur = BenchResult({"gpu_name": "x"}, (
        make_case(rng, kernel="a"),
        make_case(rng, kernel="b", helion_shift=1.2),
        make_case(rng, kernel="c"),
        CaseResult("d", "s", "bwd", missing=True),
        CaseResult("e", "s", "fwd", SamplesMs((1.0,), (1.0,)),
                   Precision(allclose=False, max_abs_diff_vs_mamba_ssm=0.5)),
    ))
    vs = check(cur, baseline, {("a", "s"): history([1.3] * 3, fp=cur.fingerprint_hash)})
    assert [v.status for v in vs] == ["ok", "regression", "no-baseline", "missing-kernel", "precision-fail"]
    assert exit_code(vs) == 1
    assert check(cur, baseline, lambda k, s: [])[1].status == "regression"
