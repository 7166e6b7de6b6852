"""Verdicts: one per kernel x shape, from a bench case, its baseline and its history.

Order of precedence (the first that applies decides)::

    missing-kernel   the Helion implementation does not exist (never passes)
    error            the case raised, or has no precision data
    precision-fail   non-finite, not allclose, or much less accurate than mamba-ssm vs fp64
    ok               CPU interpret mode: timings are not meaningful, only precision is judged
    no-baseline      nothing to compare the timings with
    ok               throttled run: speed is not judged from it
    regression       signal "ratio":    speedup vs mamba-ssm fell (Helion-specific)
    regression       signal "absolute": Helion's own latency rose while the speedup held
                                        (mamba-ssm slowed too: environment, e.g. driver or clocks)
    regression       signal "history":  slow drift over the rolling window of earlier runs
    faster           speedup vs mamba-ssm rose
    ok

Speed signals use :func:`mamba2_guard.core.stats.decide`: two-sided Mann-Whitney U p < alpha AND the
confidence bound of the shift reaches the threshold. A "ratio" or "absolute" regression is
provisional (``needs_confirmation``) until a re-run agrees (:func:`combine`).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from mamba2_guard.core import stats
from mamba2_guard.core.results import Baseline, BaselineCase, BenchResult, CaseResult, HistoryPoint

OK = "ok"
FASTER = "faster"
REGRESSION = "regression"
PRECISION_FAIL = "precision-fail"
ERROR = "error"
MISSING_KERNEL = "missing-kernel"
NO_BASELINE = "no-baseline"
STATUSES = (OK, FASTER, REGRESSION, PRECISION_FAIL, ERROR, MISSING_KERNEL, NO_BASELINE)
FAILING = frozenset({REGRESSION, PRECISION_FAIL, ERROR, MISSING_KERNEL})
SIGNALS = ("ratio", "absolute", "history")
# Most severe first: the order of reports.
SEVERITY = (PRECISION_FAIL, REGRESSION, ERROR, MISSING_KERNEL, NO_BASELINE, FASTER, OK)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


# ----------------------------------------------------------------------------------------------
# Policy


@dataclass(frozen=True)
class Policy:
    """Decision parameters; ``overrides`` maps a kernel name, or an fnmatch pattern matched against
    ``kernel`` and ``kernel/shape``, to a dict of field values (applied in order, later wins).

    Defaults and why:

    * ``alpha = 0.01``: two-sided, so 0.5 % per direction per case when noise is large enough for
      the test to be the binding gate; the confirmation re-run (both must flag) brings a declared
      false regression to ~alpha^2/4 per case. asv uses 0.002 without a re-run, gbench 0.05.
    * ``threshold = 0.05`` (speedup vs mamba-ssm) and ``absolute_threshold`` (latency; None = the
      same): the practical floor (HUD uses 5 % on helion_speedup, asv 10 %, CodSpeed 10 %).
    * ``confidence = 0.95``: the one-sided bound of the shift compared with the threshold; a true
      shift of exactly ``threshold`` is caught ~95 % of the time (given significance).
    * ``min_samples = 10``: below that the rank test cannot reach small p reliably (with 5 + 5 the
      smallest two-sided p is 0.008); fewer samples fall back to the effect alone (asv's fallback).
    * history: ``history_rule = "cusum"``: a permutation-calibrated CUSUM over the speedup series
      (and Helion's latency, for environment drift) of the last ``history_size = 20`` runs since
      the fingerprint changed; it targets persistent moves of ``history_threshold = 0.03`` (below
      the nightly 5 %), fires at permutation p < ``history_alpha = 0.002`` (false alarms per case
      per night bounded by that at any noise level), with the last ``history_persistence = 2``
      runs above the reference and at least ``history_min_points = 5`` reference runs.
      ``"persistence"`` is HUD's rule (last 2 runs above the window median by
      max(3 %, ``history_z = 4`` robust sigmas)); ``"either"`` runs both.
    * precision: fail when Helion's fp64 error exceeds ``precision_peer_factor`` (2) x mamba-ssm's
      + ``precision_peer_slack`` (the rule of ``mamba2_guard.bench.precision``);
      ``precision_growth_factor`` (off by default) also fails when ``max_abs_diff_vs_mamba_ssm``
      grew more than that factor over the baseline's.
    """

    alpha: float = 0.01
    threshold: float = 0.05
    absolute_threshold: float | None = None  # None: same as threshold
    confidence: float = 0.95
    min_samples: int = 10
    history_rule: str = "cusum"
    history_threshold: float = 0.03
    history_size: int = 20
    history_min_points: int = 5
    history_persistence: int = 2
    history_z: float = 4.0
    history_alpha: float = 0.002
    precision_peer_factor: float | None = 2.0
    precision_peer_slack: float = 1e-6
    precision_growth_factor: float | None = None
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self, "policy")
        if not isinstance(self.overrides, Mapping):
            raise ValueError(f"policy.overrides: expected a mapping of kernel name (or pattern) to settings, "
                             f"got {type(self.overrides).__name__}")
        for pattern, values in self.overrides.items():
            if not isinstance(values, Mapping):
                raise ValueError(f"policy.overrides.{pattern}: expected a mapping")
            replace(self, overrides={}, **_override_values(values, f"policy.overrides.{pattern}"))

    def for_case(self, kernel: str, shape: str) -> Policy:
        """The policy with the matching overrides applied (and no overrides left)."""
        values: dict[str, Any] = {}
        for pattern, over in self.overrides.items():
            if pattern == kernel or fnmatch.fnmatchcase(kernel, pattern) or fnmatch.fnmatchcase(
                    f"{kernel}/{shape}", pattern):
                values.update(over)
        return replace(self, overrides={}, **values)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["overrides"] = {k: dict(v) for k, v in self.overrides.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Policy:
        """From a config mapping; unknown keys raise ValueError naming them. ``kernels`` is accepted
        as an alias of ``overrides``."""
        d = dict(d or {})
        if "kernels" in d:
            d.setdefault("overrides", {})
            d["overrides"] = {**d.pop("kernels"), **d["overrides"]}
        names = {f.name for f in fields(cls)}
        for k in d:
            if k not in names:
                raise ValueError(f"policy.{k}: unknown key (allowed: {', '.join(sorted(names))})")
        return cls(**d)


_OVERRIDABLE = ("alpha", "threshold", "absolute_threshold", "confidence", "min_samples", "history_rule",
                "history_threshold", "history_min_points", "history_persistence", "history_z", "history_alpha",
                "precision_peer_factor", "precision_peer_slack",
                "precision_growth_factor")


def _override_values(values: Mapping[str, Any], path: str) -> dict[str, Any]:
    for k in values:
        if k not in _OVERRIDABLE:
            raise ValueError(f"{path}.{k}: not a per-kernel setting (allowed: {', '.join(_OVERRIDABLE)})")
    return dict(values)


def _validate(p: Policy, path: str) -> None:
    def bad(name: str, why: str) -> ValueError:
        return ValueError(f"{path}.{name}: {why}, got {getattr(p, name)!r}")

    if not 0 < p.alpha < 1:
        raise bad("alpha", "must be in (0, 1)")
    if not 0 < p.history_alpha < 1:
        raise bad("history_alpha", "must be in (0, 1)")
    for name in ("threshold", "absolute_threshold", "history_threshold"):
        v = getattr(p, name)
        if v is None and name == "absolute_threshold":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 10:
            raise bad(name, "must be a number in [0, 10)")
    if not 0.5 <= p.confidence < 1:
        raise bad("confidence", "must be in [0.5, 1)")
    for name in ("min_samples", "history_size", "history_min_points", "history_persistence"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad(name, "must be an integer >= 1")
    if p.history_rule not in stats.DRIFT_RULES:
        raise bad("history_rule", f"must be one of {stats.DRIFT_RULES}")
    for name in ("precision_peer_factor", "precision_growth_factor"):
        v = getattr(p, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise bad(name, "must be a number > 0 or null")


# ----------------------------------------------------------------------------------------------
# Verdict


@dataclass(frozen=True)
class Verdict:
    kernel: str
    shape: str
    status: str
    signal: str | None = None  # "ratio" | "absolute" | "history" | None
    effect: float | None = None  # relative slowdown of Helion (positive = slower)
    p_value: float | None = None
    confirmed: bool = False  # a regression confirmed by a re-run or by persistence (history)
    detail: str = ""
    phase: str = ""
    environment: bool = False  # the slowdown is shared with mamba-ssm (not Helion's doing)
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"verdict.status: unknown status {self.status!r}")
        if self.signal is not None and self.signal not in SIGNALS:
            raise ValueError(f"verdict.signal: unknown signal {self.signal!r}")

    @property
    def failing(self) -> bool:
        return self.status in FAILING

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        names = {f.name for f in fields(cls)}
        for k in d:
            if k not in names:
                raise ValueError(f"verdict.{k}: unknown key")
        return cls(**{k: v for k, v in d.items()})


def severity(v: Verdict) -> int:
    return SEVERITY.index(v.status)


def failures_first(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """Most severe first; stable within a status (kernel, shape order is kept)."""
    return sorted(verdicts, key=severity)


# ----------------------------------------------------------------------------------------------
# Judging


def precision_problem(case: CaseResult, baseline_case: BaselineCase | None, policy: Policy) -> str | None:
    """Why the case's precision fails, or None when it passes."""
    p = case.precision
    assert p is not None
    failure = p.failure()
    if failure:
        return failure
    if (policy.precision_peer_factor is not None and p.max_rel_err_vs_fp64 is not None
            and p.mamba_ssm_max_rel_err_vs_fp64 is not None):
        limit = policy.precision_peer_factor * p.mamba_ssm_max_rel_err_vs_fp64 + policy.precision_peer_slack
        if p.max_rel_err_vs_fp64 > limit:
            return (f"error vs fp64 {p.max_rel_err_vs_fp64:.3g} exceeds {policy.precision_peer_factor:g} x "
                    f"mamba-ssm's {p.mamba_ssm_max_rel_err_vs_fp64:.3g}")
    if (policy.precision_growth_factor is not None and baseline_case is not None
            and p.max_abs_diff_vs_mamba_ssm is not None
            and baseline_case.precision.max_abs_diff_vs_mamba_ssm is not None):
        before = baseline_case.precision.max_abs_diff_vs_mamba_ssm
        limit = policy.precision_growth_factor * before + policy.precision_peer_slack
        if p.max_abs_diff_vs_mamba_ssm > limit:
            return (f"max |diff| vs mamba-ssm grew from {before:.3g} to {p.max_abs_diff_vs_mamba_ssm:.3g} "
                    f"(> {policy.precision_growth_factor:g} x)")
    return None


def _inv(values: Sequence[float]) -> list[float]:
    return [1.0 / v for v in values if v > 0]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _p(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2g}"


def _comparisons(case: CaseResult, base: BaselineCase, policy: Policy) -> dict[str, stats.Comparison]:
    """Cost comparisons (bigger = worse): 'ratio' (helion/mamba-ssm per round), 'absolute' (helion
    latency) and 'mamba_ssm' (its latency, for the environment detail)."""
    kw = {"min_samples": policy.min_samples, "confidence": policy.confidence}
    out: dict[str, stats.Comparison] = {}
    cur_ratio = case.ratio_samples
    base_ratio = base.ratio_samples or (
        [base.speedup_vs_mamba_ssm] if base.speedup_vs_mamba_ssm else [])
    if cur_ratio and base_ratio:
        out["ratio"] = stats.compare(_inv(base_ratio), _inv(cur_ratio), **kw)
    base_h = list(base.helion.samples_ms) or [base.helion.median_ms]
    if case.samples_ms.helion:
        out["absolute"] = stats.compare(base_h, case.samples_ms.helion, **kw)
    if base.mamba_ssm is not None and case.samples_ms.mamba_ssm:
        out["mamba_ssm"] = stats.compare(list(base.mamba_ssm.samples_ms) or [base.mamba_ssm.median_ms],
                                         case.samples_ms.mamba_ssm, **kw)
    return out


def _shared_slowdown(helion: stats.Comparison, mamba: stats.Comparison | None, alpha: float) -> bool:
    """Did mamba-ssm slow down too, by at least half of Helion's slowdown (in log terms), and
    significantly? Then Helion's slowdown is the environment's (driver, clocks, thermals)."""
    if mamba is None or mamba.effect is None or helion.effect is None or helion.effect <= 0 or mamba.effect <= -1:
        return False
    if mamba.p_value is not None and mamba.p_value >= alpha:
        return False
    return math.log1p(mamba.effect) >= 0.5 * math.log1p(helion.effect)


def _history(case: CaseResult, window: Sequence[HistoryPoint], policy: Policy
             ) -> tuple[stats.DriftResult | None, stats.DriftResult | None, stats.DriftResult | None]:
    """Drift of the speedup (as a cost), of Helion's latency and (when the latter drifted, to
    attribute it) of mamba-ssm's latency, over window + this run."""
    kw = dict(rule=policy.history_rule, threshold=policy.history_threshold,
              persistence=policy.history_persistence, z=policy.history_z, alpha=policy.history_alpha,
              min_reference=policy.history_min_points)
    ratio = absolute = mamba = None
    cur_speedup, cur_ms, cur_mamba = case.speedup, case.helion_median_ms, case.mamba_ssm_median_ms
    if cur_speedup:
        series = [1.0 / p.speedup for p in window if p.speedup and p.speedup > 0] + [1.0 / cur_speedup]
        ratio = stats.drift(series, **kw)
    if cur_ms:
        series = [p.helion_median_ms for p in window if p.helion_median_ms and p.helion_median_ms > 0]
        absolute = stats.drift(series + [cur_ms], **kw)
    if absolute is not None and absolute.drifted and cur_mamba:
        series = [p.mamba_ssm_median_ms for p in window if p.mamba_ssm_median_ms and p.mamba_ssm_median_ms > 0]
        mamba = stats.drift(series + [cur_mamba], **kw)
    return ratio, absolute, mamba


def judge(
    case: CaseResult,
    baseline_case: BaselineCase | None,
    history_window: Sequence[HistoryPoint] | None = None,
    policy: Policy | None = None,
    *,
    fingerprint_hash: str | None = None,
) -> Verdict:
    """The verdict for one case. ``history_window``: earlier runs of this case, oldest first, the
    current run excluded; with ``fingerprint_hash`` the window is first cut at the last fingerprint
    change (:func:`mamba2_guard.core.stats.since_reset`)."""
    policy = (policy or Policy()).for_case(case.kernel, case.shape)
    window = list(history_window or [])
    if fingerprint_hash is not None:
        window = stats.since_reset(window, fingerprint_hash)
    window = window[-policy.history_size:]

    def verdict(status: str, detail: str, **kw: Any) -> Verdict:
        return Verdict(case.kernel, case.shape, status, detail=detail, phase=case.phase, **kw)

    unjudged = _speed_not_judged(case, baseline_case, policy)
    if unjudged:
        return verdict(*unjudged)
    assert baseline_case is not None  # _speed_not_judged answers for a case without one
    comps = _comparisons(case, baseline_case, policy)
    if not comps:
        return verdict(ERROR, "no timing samples")
    ratio = stats.decide(comps["ratio"], alpha=policy.alpha, threshold=policy.threshold) if "ratio" in comps else None
    abs_threshold = policy.threshold if policy.absolute_threshold is None else policy.absolute_threshold
    absolute = (stats.decide(comps["absolute"], alpha=policy.alpha, threshold=abs_threshold)
                if "absolute" in comps else None)
    hist_ratio, hist_abs, hist_mamba = _history(case, window, policy)
    evidence: dict[str, Any] = {k: c.to_dict() for k, c in comps.items()}
    for name, drift in (("history_ratio", hist_ratio), ("history_absolute", hist_abs),
                        ("history_mamba_ssm", hist_mamba)):
        if drift is not None:
            evidence[name] = drift.to_dict()
    evidence["history_points"] = len(window)
    mamba = comps.get("mamba_ssm")
    mamba_effect = mamba.effect if mamba else None

    if ratio is not None and ratio.direction == "slower":
        c = ratio.comparison
        return verdict(REGRESSION, f"speedup vs mamba-ssm fell: Helion {_pct(c.effect)} relative to mamba-ssm "
                       f"(p={_p(c.p_value)}; {ratio.reason}); absolute {_pct(comps['absolute'].effect)}, "
                       f"mamba-ssm {_pct(mamba_effect)}",
                       signal="ratio", effect=c.effect, p_value=c.p_value, evidence=evidence)
    if absolute is not None and absolute.direction == "slower":
        c = absolute.comparison
        shared = _shared_slowdown(c, mamba, policy.alpha)
        return verdict(REGRESSION, _absolute_slowdown_detail(c, ratio, comps, mamba_effect, shared),
                       signal="absolute", effect=c.effect, p_value=c.p_value, environment=shared, evidence=evidence)
    if hist_ratio is not None and hist_ratio.drifted:
        return verdict(REGRESSION, f"speedup vs mamba-ssm drifted over {len(window)} runs: Helion "
                       f"{_pct(hist_ratio.effect)} relative to mamba-ssm ({hist_ratio.rule}: {hist_ratio.detail})",
                       signal="history", effect=hist_ratio.effect, confirmed=True, evidence=evidence)
    if hist_abs is not None and hist_abs.drifted:
        shared, detail = _latency_drift(hist_abs, hist_mamba, len(window))
        return verdict(REGRESSION, detail, signal="history", effect=hist_abs.effect, confirmed=True,
                       environment=shared, evidence=evidence)
    if ratio is not None and ratio.direction == "faster":
        c = ratio.comparison
        return verdict(FASTER, f"speedup vs mamba-ssm rose: Helion {_pct(c.effect)} relative to mamba-ssm "
                       f"(p={_p(c.p_value)})", signal="ratio", effect=c.effect, p_value=c.p_value,
                       evidence=evidence)
    main = ratio or absolute
    assert main is not None
    c = main.comparison
    detail = main.reason
    if ratio is not None and absolute is not None and absolute.direction == "faster":
        detail = f"environment faster: Helion {_pct(comps['absolute'].effect)}, speedup held"
    return verdict(OK, detail, signal=None, effect=c.effect, p_value=c.p_value, evidence=evidence)


def _speed_not_judged(case: CaseResult, baseline_case: BaselineCase | None, policy: Policy) -> tuple[str, str] | None:
    """(status, detail) for a case whose speed is not judged (nothing ran, precision failed, no meaningful
    timing or no comparable baseline); None when it is."""
    if case.missing:
        return MISSING_KERNEL, "no Helion implementation for this kernel"
    if case.error:
        return ERROR, case.error
    if case.precision is None:
        return ERROR, "precision was not measured"
    problem = precision_problem(case, baseline_case, policy)
    if problem:
        return PRECISION_FAIL, problem
    if not case.timings_meaningful:
        return OK, "precision only: timings are not meaningful (CPU interpret mode)"
    if baseline_case is not None and baseline_case.timing_method != case.timing_method:
        before = baseline_case.timing_method or "an older, unrecorded one"
        return NO_BASELINE, (f"the baseline was timed by another method ({before}, now {case.timing_method}): "
                             "re-baseline with `mamba2-guard bench --update-baseline`")
    if baseline_case is None:
        return NO_BASELINE, "no baseline for this kernel and shape"
    if case.throttled:
        return OK, "throttled during the run: speed not judged"
    return None


def _absolute_slowdown_detail(c: Any, ratio: Any, comps: dict[str, Any], mamba_effect: float | None,
                              shared: bool) -> str:
    """What a slower absolute latency means: no paired mamba-ssm timing, the environment (mamba-ssm slowed
    as much), or Helion alone."""
    if ratio is None:
        return (f"Helion latency {_pct(c.effect)} (p={_p(c.p_value)}); no paired mamba-ssm timing "
                f"to tell Helion from the environment")
    if shared:
        return (f"environment: Helion {_pct(c.effect)} and mamba-ssm {_pct(mamba_effect)} slower, "
                f"speedup vs mamba-ssm {_pct(comps['ratio'].effect)} (held)")
    return (f"Helion latency {_pct(c.effect)} (p={_p(c.p_value)}) while mamba-ssm moved "
            f"{_pct(mamba_effect)}: Helion-specific; the speedup test fell short "
            f"({_pct(comps['ratio'].effect)}: {ratio.reason})")


def _latency_drift(hist_abs: Any, hist_mamba: Any, runs: int) -> tuple[bool, str]:
    """(shared with the environment, detail) of a latency drift over the history: shared when mamba-ssm
    drifted at least half as much (in log terms)."""
    m_eff = hist_mamba.effect if hist_mamba is not None else None
    shared = (m_eff is not None and m_eff > -1 and hist_abs.effect is not None and hist_abs.effect > 0
              and math.log1p(m_eff) >= 0.5 * math.log1p(hist_abs.effect))
    if shared:
        return shared, (f"environment drift over {runs} runs: Helion latency {_pct(hist_abs.effect)} and "
                        f"mamba-ssm {_pct(m_eff)} ({hist_abs.rule}: {hist_abs.detail})")
    return shared, (f"Helion latency drifted {_pct(hist_abs.effect)} over {runs} runs while mamba-ssm "
                    f"moved {_pct(m_eff)} ({hist_abs.rule}: {hist_abs.detail})")


def needs_confirmation(verdict: Verdict) -> bool:
    """True for a provisional regression (ratio or absolute signal) that no re-run has confirmed.
    History regressions are confirmed by persistence; other statuses are deterministic."""
    return verdict.status == REGRESSION and verdict.signal in ("ratio", "absolute") and not verdict.confirmed


def _brief(v: Verdict) -> dict[str, Any]:
    return {"status": v.status, "signal": v.signal, "effect": v.effect, "p_value": v.p_value, "detail": v.detail}


def combine(first: Verdict, confirmation: Verdict) -> Verdict:
    """Merge a provisional regression with the verdict of its re-run.

    Both runs must flag for the regression to stand (an intersection-union test: the declared
    p-value is the larger of the two, the effect the smaller); the signal stays "ratio" only if
    both runs say so, else it is "absolute". A re-run that finds a worse problem (precision-fail,
    error, missing-kernel) replaces the first verdict; one that finds nothing clears it ("ok").
    """
    if not needs_confirmation(first):
        return first
    if (first.kernel, first.shape) != (confirmation.kernel, confirmation.shape):
        raise ValueError(f"confirmation of {confirmation.kernel}/{confirmation.shape} "
                         f"does not match {first.kernel}/{first.shape}")
    evidence = {"first": _brief(first), "confirmation": _brief(confirmation)}
    if confirmation.status in (PRECISION_FAIL, ERROR, MISSING_KERNEL):
        return replace(confirmation, detail=f"on re-run: {confirmation.detail}",
                       evidence={**confirmation.evidence, **evidence})
    if confirmation.status == REGRESSION and confirmation.signal in ("ratio", "absolute"):
        signal = "ratio" if first.signal == confirmation.signal == "ratio" else "absolute"
        effects = [e for e in (first.effect, confirmation.effect) if e is not None]
        ps = [p for p in (first.p_value, confirmation.p_value)]
        p = None if any(x is None for x in ps) else max(ps)  # type: ignore[type-var]
        source = confirmation if confirmation.signal == signal else first
        return replace(
            source, signal=signal, effect=min(effects) if effects else None, p_value=p, confirmed=True,
            environment=signal == "absolute" and first.environment and confirmation.environment,
            detail=(f"confirmed on re-run ({_pct(first.effect)} then {_pct(confirmation.effect)}): "
                    f"{source.detail}"),
            evidence=evidence,
        )
    if confirmation.status == REGRESSION:  # history drift on the re-run: stands on its own evidence
        return replace(confirmation, evidence={**confirmation.evidence, **evidence})
    return Verdict(
        first.kernel, first.shape, OK, signal=None, effect=confirmation.effect, p_value=confirmation.p_value,
        confirmed=False, phase=first.phase,
        detail=(f"not confirmed: first run flagged {first.signal} {_pct(first.effect)} (p={_p(first.p_value)}), "
                f"re-run {confirmation.status} {_pct(confirmation.effect)}"),
        evidence=evidence,
    )


def exit_code(verdicts: Iterable[Verdict], usage_error: bool = False, *, missing_fails: bool = True) -> int:
    """0 all good, 1 any regression / precision-fail / error / missing-kernel, 2 usage or
    environment error (the caller says so: bad arguments, no device, unreadable baseline).
    ``missing_fails=False``: kernels not implemented yet are reported but do not fail the run."""
    if usage_error:
        return EXIT_USAGE
    failing = FAILING if missing_fails else FAILING - {MISSING_KERNEL}
    return EXIT_FAIL if any(v.status in failing for v in verdicts) else EXIT_OK


HistorySource = Mapping[tuple[str, str], Sequence[HistoryPoint]] | Callable[[str, str], Sequence[HistoryPoint]]


def check(result: BenchResult, baseline: Baseline | None, history: HistorySource | None = None,
          policy: Policy | None = None) -> list[Verdict]:
    """Judge every case of ``result`` (in the result's order). ``history`` gives each case's earlier
    runs (a mapping keyed by ``(kernel, shape)`` or a callable); it is cut at the last change of
    the result's fingerprint."""
    policy = policy or Policy()
    fp = result.fingerprint_hash
    out = []
    for case in result.cases:
        if history is None:
            window: Sequence[HistoryPoint] = []
        elif callable(history):
            window = history(case.kernel, case.shape)
        else:
            window = history.get(case.key, [])
        base = baseline.get(case.kernel, case.shape) if baseline is not None else None
        out.append(judge(case, base, window, policy, fingerprint_hash=fp))
    return out
