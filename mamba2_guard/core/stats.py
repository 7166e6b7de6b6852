"""Statistics for regression decisions: summaries, paired ratios, the rank test, drift over history.

Pure and deterministic (no random numbers, no clock). Modelled on asv's split between ``_stats.py``
(is this pair of sample sets different?) and ``step_detect.py`` (has the series moved?).

Conventions
-----------
* Everything that goes into a test is a *cost*: bigger is worse. Latencies are costs as they are;
  a speedup vs mamba-ssm is turned into a cost by inverting it (``mamba_ssm / helion`` becomes
  ``helion / mamba_ssm``), so "5 % slower" means the same thing on both signals.
* Tests run on ``log(cost)``: a relative change is a shift in log space, which is what a location
  test (Mann-Whitney) and its Hodges-Lehmann estimate measure.
* ``effect`` is the relative change of medians, ``median(current) / median(baseline) - 1``;
  positive means slower.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, TypeVar

import numpy as np

_NORMAL = NormalDist()
# The scale of a normal distribution in units of its median absolute deviation.
MAD_TO_SIGMA = 1.4826
# Above this many pairwise differences, the Hodges-Lehmann interval works on quantile-thinned samples.
_MAX_PAIRS = 400_000


# ----------------------------------------------------------------------------------------------
# Summaries


@dataclass(frozen=True)
class Summary:
    """Order statistics of one sample set (linear-interpolated quantiles, as numpy's default)."""

    n: int
    median: float
    p10: float
    p90: float
    q1: float
    q3: float
    iqr: float
    min: float
    max: float
    mean: float

    def to_dict(self) -> dict[str, float | int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def clean(samples: Iterable[Any] | None) -> np.ndarray:
    """The finite, strictly positive values of ``samples`` as float64 (timings and ratios only)."""
    if samples is None:
        return np.empty(0)
    arr = np.asarray([float(x) for x in samples], dtype=np.float64)
    return arr[np.isfinite(arr) & (arr > 0)]


def summarize(samples: Iterable[Any] | None) -> Summary | None:
    """Median, p10, p90, IQR etc. of the usable samples; None when there are none."""
    arr = clean(samples)
    if arr.size == 0:
        return None
    p10, q1, med, q3, p90 = (float(v) for v in np.quantile(arr, [0.10, 0.25, 0.5, 0.75, 0.90]))
    return Summary(
        n=int(arr.size), median=med, p10=p10, p90=p90, q1=q1, q3=q3, iqr=q3 - q1,
        min=float(arr.min()), max=float(arr.max()), mean=float(arr.mean()),
    )


def median(samples: Iterable[Any] | None) -> float | None:
    arr = clean(samples)
    return float(np.median(arr)) if arr.size else None


def paired_ratios(helion_ms: Sequence[float], mamba_ssm_ms: Sequence[float]) -> list[float]:
    """Per-round speedups ``mamba_ssm_i / helion_i`` of interleaved samples (round i times both).

    Raises ValueError when the two lists differ in length (they are then not paired); rounds in
    which either timing is unusable (non-finite or <= 0) are dropped.
    """
    if len(helion_ms) != len(mamba_ssm_ms):
        raise ValueError(
            f"paired samples differ in length: helion {len(helion_ms)}, mamba_ssm {len(mamba_ssm_ms)}"
        )
    out = []
    for h, m in zip(helion_ms, mamba_ssm_ms, strict=True):
        h, m = float(h), float(m)
        if math.isfinite(h) and math.isfinite(m) and h > 0 and m > 0:
            out.append(m / h)
    return out


def speedup(helion_ms: Sequence[float], mamba_ssm_ms: Sequence[float]) -> float | None:
    """Speedup vs mamba-ssm: median of the paired per-round ratios when the samples are paired,
    else the ratio of medians. None when either side has no usable sample."""
    if helion_ms and len(helion_ms) == len(mamba_ssm_ms):
        r = paired_ratios(helion_ms, mamba_ssm_ms)
        if r:
            return float(np.median(r))
    h, m = median(helion_ms), median(mamba_ssm_ms)
    return m / h if h and m else None


# ----------------------------------------------------------------------------------------------
# Two-sample comparison (Mann-Whitney U + Hodges-Lehmann interval)


@dataclass(frozen=True)
class Comparison:
    """Baseline vs current sample sets of one cost (bigger = worse).

    ``p_value`` is the two-sided Mann-Whitney p (None when the test could not run: too few samples).
    ``effect`` is the relative change of medians. ``lower``/``upper`` are one-sided bounds at
    ``confidence`` on the relative shift (Hodges-Lehmann / Moses interval on log values; ``None``
    when there are not enough samples for that confidence).
    """

    n_baseline: int
    n_current: int
    effect: float | None
    p_value: float | None
    lower: float | None
    upper: float | None
    confidence: float
    method: str  # "mann-whitney" | "identical" | "too-few-samples" | "no-samples" | "out-of-range"

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _average_ranks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1-based average ranks of ``x`` (ties share the mean rank) and the tie group sizes."""
    uniq, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    avg = ends - (counts - 1) / 2.0
    return avg[inverse], counts


def mann_whitney_asymptotic(baseline: np.ndarray, current: np.ndarray) -> float:
    """Two-sided Mann-Whitney p by the normal approximation with tie and continuity corrections:
    the same number as ``scipy.stats.mannwhitneyu(current, baseline, method="asymptotic")``
    (tested), without scipy's per-call overhead (~5 ms), which matters over hundreds of cases."""
    n1, n2 = current.size, baseline.size
    ranks, ties = _average_ranks(np.concatenate([current, baseline]))
    u1 = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2.0
    u = max(u1, n1 * n2 - u1)
    n = n1 + n2
    tie_term = float((ties**3 - ties).sum()) / (n * (n - 1))
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)
    return min(1.0, max(0.0, math.erfc(z / math.sqrt(2.0))))


# Below this many samples on either side scipy computes the exact distribution (no ties).
EXACT_BELOW = 8


def mann_whitney(baseline: Sequence[float], current: Sequence[float], min_samples: int = 5) -> float | None:
    """Two-sided Mann-Whitney U p-value, or None with fewer than ``min_samples`` on either side.

    All values equal (on both sides together) gives 1.0: scipy would divide by a zero variance.
    Two-sided because the same test serves "regression" and "faster"; the decision reads the
    direction from the effect, so each direction is tested at alpha / 2. Small samples go to
    ``scipy.stats.mannwhitneyu`` (exact distribution when there are no ties), larger ones to the
    equivalent normal approximation of :func:`mann_whitney_asymptotic`.
    """
    a, b = clean(baseline), clean(current)
    if min(a.size, b.size) < max(1, min_samples):
        return None
    pooled = np.concatenate([a, b])
    if np.all(pooled == pooled[0]):
        return 1.0
    if min(a.size, b.size) >= EXACT_BELOW:
        return mann_whitney_asymptotic(a, b)
    from scipy.stats import mannwhitneyu  # imported here: scipy takes seconds to import

    p = float(mannwhitneyu(b, a, alternative="two-sided", method="auto").pvalue)
    return p if math.isfinite(p) else 1.0


def _thin(arr: np.ndarray, size: int) -> np.ndarray:
    if arr.size <= size:
        return arr
    return np.quantile(arr, (np.arange(size) + 0.5) / size)


def _expm1(x: float) -> float:
    return math.expm1(x) if x < 700.0 else math.inf


def shift_bounds(
    baseline: Sequence[float], current: Sequence[float], confidence: float = 0.95
) -> tuple[float | None, float | None, float | None]:
    """Hodges-Lehmann shift of ``log(current)`` vs ``log(baseline)`` and its one-sided bounds.

    Returns ``(estimate, lower, upper)`` as relative changes (``exp(shift) - 1``). Each bound holds
    with probability ``confidence`` (Moses' distribution-free interval, normal approximation of the
    U distribution, no tie correction). A bound is None when the samples are too few to reach that
    confidence (the interval is then unbounded on that side).
    """
    a, b = np.log(clean(baseline)), np.log(clean(current))
    if a.size == 0 or b.size == 0:
        return None, None, None
    while a.size * b.size > _MAX_PAIRS:
        a, b = _thin(a, max(50, a.size // 2)), _thin(b, max(50, b.size // 2))
    m, n = a.size, b.size
    diffs = np.sort((b[:, None] - a[None, :]).ravel())
    estimate = float(np.median(diffs))
    z = _NORMAL.inv_cdf(confidence)
    # C = number of pairwise differences cut from each end (the U critical value).
    c = math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12.0))
    if c < 1:
        return _expm1(estimate), None, None
    lower = float(diffs[c - 1])
    upper = float(diffs[m * n - c])
    return _expm1(estimate), _expm1(lower), _expm1(upper)


def compare(
    baseline: Sequence[float] | None,
    current: Sequence[float] | None,
    *,
    min_samples: int = 10,
    confidence: float = 0.95,
) -> Comparison:
    """Compare two sample sets of a cost: effect of medians, Mann-Whitney p, shift bounds."""
    a, b = clean(baseline), clean(current)
    na, nb = int(a.size), int(b.size)
    if na == 0 or nb == 0:
        return Comparison(na, nb, None, None, None, None, confidence, "no-samples")
    with np.errstate(over="ignore", invalid="ignore"):
        effect = float(np.median(b) / np.median(a) - 1.0)
    if not math.isfinite(effect):  # absurd magnitudes (1e300 ms; inf / inf): nothing sensible to say
        return Comparison(na, nb, None, None, None, None, confidence, "out-of-range")
    if min(na, nb) < max(2, min_samples):
        return Comparison(na, nb, effect, None, None, None, confidence, "too-few-samples")
    pooled = np.concatenate([a, b])
    if np.all(pooled == pooled[0]):
        return Comparison(na, nb, 0.0, 1.0, 0.0, 0.0, confidence, "identical")
    p = mann_whitney(a, b, min_samples=min_samples)
    _, lower, upper = shift_bounds(a, b, confidence)
    return Comparison(na, nb, effect, p, lower, upper, confidence, "mann-whitney")


@dataclass(frozen=True)
class Decision:
    """What one signal says: 'slower', 'faster' or None (no change worth reporting)."""

    direction: str | None
    comparison: Comparison
    reason: str


def decide(comparison: Comparison, *, alpha: float, threshold: float) -> Decision:
    """The two-tier gate on one comparison of costs.

    *slower* when the change is statistically significant (two-sided Mann-Whitney p < alpha) AND a
    slowdown of ``threshold`` or more is consistent with the data: the upper confidence bound of the
    shift reaches ``threshold``. Using the bound rather than the point estimate is what makes a true
    shift of exactly ``threshold`` be caught with probability ~``confidence`` instead of ~50 %,
    while shifts that are significant but demonstrably smaller than the threshold stay quiet.
    *faster* mirrors it (speedup of ``threshold`` or more: cost ratio <= 1 / (1 + threshold)).

    With too few samples for the test (p is None), the rule falls back to the effect alone, as asv
    does when it cannot test: ``effect >= threshold``. With no samples there is no decision.
    """
    c = comparison
    if c.effect is None:
        return Decision(None, c, "no samples")
    slower_edge = threshold
    faster_edge = 1.0 / (1.0 + threshold) - 1.0
    if c.p_value is None:
        if c.effect >= slower_edge:
            return Decision("slower", c, "too few samples to test; effect alone")
        if c.effect <= faster_edge:
            return Decision("faster", c, "too few samples to test; effect alone")
        return Decision(None, c, "too few samples to test")
    if c.p_value >= alpha:
        return Decision(None, c, f"not significant (p={c.p_value:.3g} >= {alpha:g})")
    up = math.inf if c.upper is None else c.upper
    lo = -math.inf if c.lower is None else c.lower
    if c.effect > 0 and up >= slower_edge:
        return Decision("slower", c, "significant and reaches the threshold")
    if c.effect < 0 and lo <= faster_edge:
        return Decision("faster", c, "significant and reaches the threshold")
    return Decision(None, c, "significant but below the threshold")


# ----------------------------------------------------------------------------------------------
# History: window reset and drift


T = TypeVar("T")


def since_reset(entries: Sequence[T], fingerprint_hash: str, key: Callable[[T], str] | None = None) -> list[T]:
    """The entries (oldest first) after the last one whose fingerprint differs from ``fingerprint_hash``.

    A fingerprint change is a distribution change (conbench's manual annotation, made automatic):
    history from before it is not comparable and would both inflate the spread and raise alarms.
    """
    get = key or (lambda e: e.fingerprint_hash)  # type: ignore[attr-defined]
    start = 0
    for i, e in enumerate(entries):
        if get(e) != fingerprint_hash:
            start = i + 1
    return list(entries[start:])


@dataclass(frozen=True)
class DriftResult:
    """The verdict of one drift rule on a history series (costs, oldest first, current last)."""

    drifted: bool
    rule: str
    effect: float | None  # level of the recent points vs the reference, relative (positive = worse)
    reference: float | None  # reference level (median), in the series' units
    recent: float | None  # median of the recent points
    violations: int  # consecutive violating points at the tail (persistence rule)
    statistic: float | None  # CUSUM value (log units)
    insufficient: bool  # too little history to judge
    detail: str
    p_value: float | None = None  # permutation p of the CUSUM (None: not computed)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _robust_sigma(logs: np.ndarray) -> float:
    """Noise scale of a series that may trend: MAD of first differences / sqrt(2) (conbench's
    residual idea), falling back to the MAD of values when the differences are all equal."""
    if logs.size < 3:
        return 0.0
    d = np.diff(logs)
    s = MAD_TO_SIGMA * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2.0)
    if s == 0.0:
        s = MAD_TO_SIGMA * float(np.median(np.abs(logs - np.median(logs))))
    return s


def _insufficient(rule: str, n: int, need: int) -> DriftResult:
    return DriftResult(False, rule, None, None, None, 0, None, True,
                       f"insufficient history: {n} reference points, need {need}")


def persistence_drift(
    values: Sequence[float],
    *,
    threshold: float = 0.03,
    persistence: int = 2,
    z: float = 4.0,
    min_reference: int = 5,
    sigma_floor: float = 0.0,
) -> DriftResult:
    """HUD-style rule: the last ``persistence`` points all exceed the reference level.

    Reference = median of the points before them. A point violates when its log-distance above the
    reference exceeds ``max(log1p(threshold), z * sigma)``, sigma being a robust noise scale of the
    reference (so a noisy series needs a bigger move than a quiet one). ``>= persistence``
    consecutive violations at the tail is a drift (HUD's "regression"); an isolated spike is not.
    """
    logs = np.log(clean(values))
    rule = "persistence"
    if logs.size != len(values):
        raise ValueError("history values must be finite and positive")
    ref = logs[:-persistence] if persistence > 0 else logs
    if ref.size < min_reference:
        return _insufficient(rule, int(ref.size), min_reference)
    level = float(np.median(ref))
    sigma = max(_robust_sigma(ref), sigma_floor)
    bound = max(math.log1p(threshold), z * sigma)
    count = 0
    for v in logs[::-1]:
        if v - level > bound:
            count += 1
        else:
            break
    recent = logs[-persistence:]
    effect = _expm1(float(np.median(recent)) - level)
    drifted = count >= persistence
    detail = (f"last {count} point(s) above reference {math.exp(level):.4g} by > {_expm1(bound):.1%}"
              if count else "no violation at the tail")
    return DriftResult(drifted, rule, effect, math.exp(level), math.exp(float(np.median(recent))),
                       count, None, False, detail)


_PERMUTATIONS: dict[tuple[int, int], np.ndarray] = {}
_PERMUTATION_SEED = 20260901  # fixed: the test is deterministic (pure), the permutations are just a design


def _permutations(n: int, count: int) -> np.ndarray:
    key = (n, count)
    if key not in _PERMUTATIONS:
        if len(_PERMUTATIONS) > 64:
            _PERMUTATIONS.clear()
        rng = np.random.default_rng(_PERMUTATION_SEED)
        _PERMUTATIONS[key] = np.argsort(rng.random((count, n)), axis=1)
    return _PERMUTATIONS[key]


def _cusum(x: np.ndarray, n_ref: int, k: float) -> np.ndarray:
    """Page's one-sided CUSUM over ``x[..., n_ref:]`` against the median of ``x[..., :n_ref]``."""
    level = np.median(x[..., :n_ref], axis=-1)
    s = np.zeros(x.shape[:-1])
    for t in range(n_ref, x.shape[-1]):
        s = np.maximum(0.0, s + x[..., t] - level - k)
    return s


def cusum_drift(
    values: Sequence[float],
    *,
    threshold: float = 0.03,
    alpha: float = 0.002,
    min_reference: int = 5,
    persistence: int = 2,
    permutations: int = 2000,
) -> DriftResult:
    """Permutation-calibrated one-sided CUSUM (Page's test) on log costs: catches small persistent
    shifts and slow drifts that no single run makes obvious.

    The first half of the series (at least ``min_reference`` points) is the reference (its median
    is the level); the rest is monitored with ``S_t = max(0, S_{t-1} + x_t - level - k)``,
    ``k = log1p(threshold) / 2`` (the optimal k for a shift of ``threshold``). Instead of an alarm
    limit in units of an estimated sigma (ten points make a poor sigma: in simulation that gave
    0.5-3.5 % false alarms per night at 2-4 % noise), the final ``S`` is compared with its
    distribution over a fixed set of permutations of the same series: under "no change" the runs
    are exchangeable, so ``p = P(S_perm >= S)`` bounds the false-alarm rate by ``alpha`` at any
    noise level and for any distribution. A drift also needs the last ``persistence`` points each
    above ``level + k``: the alarm describes the present, not an excursion that has reverted.
    """
    logs = np.log(clean(values))
    rule = "cusum"
    if logs.size != len(values):
        raise ValueError("history values must be finite and positive")
    n = int(logs.size)
    n_ref = max(min_reference, n // 2)
    if n - n_ref < 1:
        return _insufficient(rule, max(0, n - 1), min_reference)
    k = math.log1p(threshold) / 2.0
    level = float(np.median(logs[:n_ref]))
    stat = float(_cusum(logs, n_ref, k))
    tail = logs[-persistence:] if persistence > 0 else logs[-1:]
    present = bool(np.all(tail - level > k))
    count = 0
    for v in logs[::-1]:
        if v - level > k:
            count += 1
        else:
            break
    p = None
    if stat > 0 and present:
        perm = _cusum(logs[_permutations(n, permutations)], n_ref, k)
        p = float((1 + np.count_nonzero(perm >= stat - 1e-12)) / (1 + permutations))
    drifted = p is not None and p < alpha
    recent = float(np.median(tail))
    effect = _expm1(recent - level)
    detail = (f"CUSUM {stat:.3g} over {n - n_ref} monitored run(s), permutation p="
              f"{'n/a' if p is None else format(p, '.2g')} (alarm < {alpha:g})")
    return DriftResult(drifted, rule, effect, math.exp(level), math.exp(recent), count, stat, False, detail, p)


DRIFT_RULES = ("persistence", "cusum", "either")


def drift(values: Sequence[float], *, rule: str = "cusum", threshold: float = 0.03,
          persistence: int = 2, z: float = 4.0, alpha: float = 0.002, min_reference: int = 5,
          permutations: int = 2000) -> DriftResult:
    """Run the chosen drift rule(s) on a cost series (oldest first, current last); with
    ``"either"`` the first rule that fires is returned (else the CUSUM result)."""
    if rule not in DRIFT_RULES:
        raise ValueError(f"unknown drift rule {rule!r}; expected one of {DRIFT_RULES}")
    results = []
    if rule in ("persistence", "either"):
        results.append(persistence_drift(values, threshold=threshold, persistence=persistence, z=z,
                                         min_reference=min_reference))
    if rule in ("cusum", "either"):
        results.append(cusum_drift(values, threshold=threshold, alpha=alpha, min_reference=min_reference,
                                   persistence=persistence, permutations=permutations))
    for r in results:
        if r.drifted:
            return r
    return results[-1]
