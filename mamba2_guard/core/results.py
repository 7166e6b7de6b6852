"""The data the bench runner produces and ``check`` consumes: bench results and baseline files.

Pure: dicts in, dataclasses out, and back. File I/O (JSON, YAML) is the caller's job.

Bench result (JSON, ``schema_version`` = :data:`SCHEMA_VERSION`)::

    {"schema_version": 1, "fingerprint": {...}, "device_peaks": {...}, "suite": "nightly",
     "started_at": "2026-09-01T03:00:00+00:00", "extra": {...},
     "cases": [{"kernel": "ssd_chunk_scan_fwd", "shape": "b4_l4096", "phase": "fwd", "seed": 0,
                "samples_ms": {"helion": [...], "mamba_ssm": [...]},   # paired by round
                "precision": {"mean_abs_diff_vs_mamba_ssm": ..., "max_abs_diff_vs_mamba_ssm": ...,
                              "max_rel_err_vs_fp64": ..., "mamba_ssm_max_rel_err_vs_fp64": ...,
                              "allclose": true, "finite": true, "ok": true, "outputs": [...]},
                "roofline_fraction": 0.71, "layer_share": 0.18, "throttled": false,
                "error": null, "missing": false, "timings_meaningful": true, "extra": {...},
                "summary": {...}}]}                # derived on write, ignored on read

Baseline file (YAML; ``load_baseline`` takes the parsed dict)::

    schema_version: 1
    fingerprint: {...}
    device_peaks: {...}
    results:
      <kernel>:
        <shape>:
          phase: fwd
          seed: 0
          helion:    {median_ms, p10_ms, p90_ms, iqr_ms, n, samples_ms: [...]}
          mamba_ssm: {median_ms, p10_ms, p90_ms, iqr_ms, n, samples_ms: [...]}
          speedup_vs_mamba_ssm: 1.31     # median of the paired per-round ratios
          precision: {max_abs_diff_vs_mamba_ssm, mean_abs_diff_vs_mamba_ssm, max_rel_err_vs_fp64,
                      mamba_ssm_max_rel_err_vs_fp64, allclose, finite}
          roofline_fraction: 0.71

Validation errors name the offending key as a path, e.g. ``cases[3].samples_ms.helion[2]``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mamba2_guard.core import stats
from mamba2_guard.core.fingerprint_hash import fingerprint_hash

SCHEMA_VERSION = 1
BASELINE_SCHEMA_VERSION = 1
IMPLS = ("helion", "mamba_ssm")


class SchemaError(ValueError):
    """A bench result or baseline document does not match the schema; ``path`` names the bad key."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


# ----------------------------------------------------------------------------------------------
# Validation helpers


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SchemaError(path, f"expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(d: Mapping[str, Any], path: str, allowed: Iterable[str], required: Iterable[str] = ()) -> None:
    allowed = set(allowed)
    for k in d:
        if k not in allowed:
            raise SchemaError(_join(path, str(k)), f"unknown key (allowed: {', '.join(sorted(allowed))})")
    for k in required:
        if k not in d:
            raise SchemaError(_join(path, k), "required key is missing")


def _str(value: Any, path: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise SchemaError(path, f"expected a string, got {value!r}")
    return value


def _bool(value: Any, path: str, *, optional: bool = False) -> bool | None:
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise SchemaError(path, f"expected true/false, got {value!r}")
    return value


def _int(value: Any, path: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(path, f"expected an integer, got {value!r}")
    return value


def _num(value: Any, path: str, *, optional: bool = False, positive: bool = False,
         nonneg: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(path, f"expected a number, got {value!r}")
    f = float(value)
    if not math.isfinite(f):
        raise SchemaError(path, f"expected a finite number, got {value!r}")
    if positive and not f > 0:
        raise SchemaError(path, f"expected a number > 0, got {value!r}")
    if nonneg and f < 0:
        raise SchemaError(path, f"expected a number >= 0, got {value!r}")
    return f


def _samples(value: Any, path: str) -> list[float]:
    if value is None:
        return []
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise SchemaError(path, f"expected a list of milliseconds, got {type(value).__name__}")
    return [_num(v, _join(path, i), positive=True) for i, v in enumerate(value)]  # type: ignore[misc]


def _dict(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    return dict(_mapping(value, path))


def _sig(x: float | None, digits: int = 6) -> float | None:
    """Round to ``digits`` significant digits: stable, diffable baseline files."""
    return None if x is None else float(f"{x:.{digits}g}")


# ----------------------------------------------------------------------------------------------
# Bench result


PRECISION_NUMBERS = (
    "mean_abs_diff_vs_mamba_ssm",
    "max_abs_diff_vs_mamba_ssm",
    "max_rel_err_vs_fp64",
    "mamba_ssm_max_rel_err_vs_fp64",
)
PRECISION_FLAGS = ("allclose", "finite", "ok")


@dataclass(frozen=True)
class Precision:
    """Precision of one case, over its outputs (the worst output for each number).

    ``ok`` is the runner's own per-output decision when it made one (``mamba2_guard.bench.precision``);
    ``outputs`` keeps the per-output details as plain dicts.
    """

    mean_abs_diff_vs_mamba_ssm: float | None = None
    max_abs_diff_vs_mamba_ssm: float | None = None
    max_rel_err_vs_fp64: float | None = None
    mamba_ssm_max_rel_err_vs_fp64: float | None = None
    allclose: bool | None = None
    finite: bool | None = None
    ok: bool | None = None
    outputs: tuple[dict[str, Any], ...] = ()

    def failure(self) -> str | None:
        """Why the runner's numbers fail, or None. Without mamba-ssm, ``allclose`` was against fp64, which
        bf16 outputs need not meet: there the runner's ``ok`` (the same-dtype bound) decides."""
        if self.finite is False:
            return "non-finite values in the Helion output"
        has_peer = self.max_abs_diff_vs_mamba_ssm is not None
        if self.allclose is False and has_peer:
            return "Helion output is not allclose to mamba-ssm (per-output tolerances)"
        if self.ok is False:
            if not has_peer:
                return "Helion output fails the fp64 criterion (no mamba-ssm to compare with here)"
            return "the runner marked the precision check failed"
        return None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self, k) for k in PRECISION_NUMBERS + PRECISION_FLAGS}
        d["outputs"] = [dict(o) for o in self.outputs]
        return d

    @classmethod
    def from_dict(cls, d: Any, path: str = "precision") -> Precision:
        d = _mapping(d, path)
        _check_keys(d, path, PRECISION_NUMBERS + PRECISION_FLAGS + ("outputs",))
        outputs = d.get("outputs") or []
        if not isinstance(outputs, list):
            raise SchemaError(_join(path, "outputs"), "expected a list")
        return cls(
            **{k: _num(d.get(k), _join(path, k), optional=True, nonneg=True) for k in PRECISION_NUMBERS},
            **{k: _bool(d.get(k), _join(path, k), optional=True) for k in PRECISION_FLAGS},
            outputs=tuple(dict(_mapping(o, _join(_join(path, "outputs"), i))) for i, o in enumerate(outputs)),
        )


@dataclass(frozen=True)
class SamplesMs:
    """Per-round timings in milliseconds; sample i of each was timed in the same round."""

    helion: tuple[float, ...] = ()
    mamba_ssm: tuple[float, ...] = ()

    @property
    def paired(self) -> bool:
        return bool(self.helion) and len(self.helion) == len(self.mamba_ssm)

    def to_dict(self) -> dict[str, list[float]]:
        return {"helion": list(self.helion), "mamba_ssm": list(self.mamba_ssm)}

    @classmethod
    def from_dict(cls, d: Any, path: str = "samples_ms") -> SamplesMs:
        d = _mapping(d, path)
        _check_keys(d, path, IMPLS)
        h = _samples(d.get("helion"), _join(path, "helion"))
        m = _samples(d.get("mamba_ssm"), _join(path, "mamba_ssm"))
        if h and m and len(h) != len(m):
            raise SchemaError(_join(path, "mamba_ssm"),
                              f"{len(m)} samples but helion has {len(h)} (samples are paired by round)")
        return cls(tuple(h), tuple(m))


CASE_KEYS = (
    "kernel", "shape", "phase", "seed", "samples_ms", "precision", "roofline_fraction", "layer_share",
    "throttled", "error", "missing", "timings_meaningful", "extra", "summary",
)


@dataclass(frozen=True)
class CaseResult:
    """One kernel x shape of a bench run."""

    kernel: str
    shape: str
    phase: str = ""
    samples_ms: SamplesMs = field(default_factory=SamplesMs)
    precision: Precision | None = None
    roofline_fraction: float | None = None  # achieved / roofline-bound time, 0..1
    layer_share: float | None = None  # share of the layer's time spent in this kernel, 0..1
    throttled: bool = False
    error: str | None = None
    missing: bool = False  # the Helion implementation does not exist
    timings_meaningful: bool = True  # False in CPU interpret mode
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.kernel, self.shape)

    def summary(self, impl: str) -> stats.Summary | None:
        return stats.summarize(getattr(self.samples_ms, impl))

    @property
    def timing_method(self) -> str | None:
        """How the samples were taken (``mamba2_guard.bench.timing.method``): numbers of two methods do not compare."""
        return (self.extra or {}).get("timing_method")

    @property
    def helion_median_ms(self) -> float | None:
        return stats.median(self.samples_ms.helion)

    @property
    def mamba_ssm_median_ms(self) -> float | None:
        return stats.median(self.samples_ms.mamba_ssm)

    @property
    def ratio_samples(self) -> list[float]:
        """Per-round speedups vs mamba-ssm (empty when the samples are not paired)."""
        s = self.samples_ms
        return stats.paired_ratios(s.helion, s.mamba_ssm) if s.paired else []

    @property
    def speedup(self) -> float | None:
        return stats.speedup(self.samples_ms.helion, self.samples_ms.mamba_ssm)

    def to_dict(self) -> dict[str, Any]:
        summary: dict[str, Any] = {}
        for impl in IMPLS:
            s = self.summary(impl)
            summary[impl] = None if s is None else {
                "median_ms": s.median, "p10_ms": s.p10, "p90_ms": s.p90, "iqr_ms": s.iqr, "n": s.n}
        summary["speedup_vs_mamba_ssm"] = self.speedup
        return {
            "kernel": self.kernel, "shape": self.shape, "phase": self.phase, "seed": self.seed,
            "samples_ms": self.samples_ms.to_dict(),
            "precision": None if self.precision is None else self.precision.to_dict(),
            "roofline_fraction": self.roofline_fraction, "layer_share": self.layer_share,
            "throttled": self.throttled, "error": self.error, "missing": self.missing,
            "timings_meaningful": self.timings_meaningful, "extra": dict(self.extra),
            "summary": summary,
        }

    @classmethod
    def from_dict(cls, d: Any, path: str = "case") -> CaseResult:
        d = _mapping(d, path)
        _check_keys(d, path, CASE_KEYS, required=("kernel", "shape"))
        prec = d.get("precision")
        return cls(
            kernel=_str(d["kernel"], _join(path, "kernel")),  # type: ignore[arg-type]
            shape=_str(d["shape"], _join(path, "shape")),  # type: ignore[arg-type]
            phase=_str(d.get("phase", ""), _join(path, "phase")) or "",
            samples_ms=SamplesMs.from_dict(d.get("samples_ms") or {}, _join(path, "samples_ms")),
            precision=None if prec is None else Precision.from_dict(prec, _join(path, "precision")),
            roofline_fraction=_num(d.get("roofline_fraction"), _join(path, "roofline_fraction"),
                                   optional=True, nonneg=True),
            layer_share=_num(d.get("layer_share"), _join(path, "layer_share"), optional=True, nonneg=True),
            throttled=bool(_bool(d.get("throttled", False), _join(path, "throttled"))),
            error=_str(d.get("error"), _join(path, "error"), optional=True),
            missing=bool(_bool(d.get("missing", False), _join(path, "missing"))),
            timings_meaningful=bool(_bool(d.get("timings_meaningful", True), _join(path, "timings_meaningful"))),
            seed=_int(d.get("seed"), _join(path, "seed"), optional=True),
            extra=_dict(d.get("extra"), _join(path, "extra")),
        )


RESULT_KEYS = ("schema_version", "fingerprint", "device_peaks", "cases", "suite", "started_at", "extra")


@dataclass(frozen=True)
class BenchResult:
    fingerprint: dict[str, Any]
    cases: tuple[CaseResult, ...]
    device_peaks: dict[str, Any] = field(default_factory=dict)
    suite: str | None = None
    started_at: str | None = None  # ISO 8601, set by the runner (core reads no clock)
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def fingerprint_hash(self) -> str:
        return fingerprint_hash(self.fingerprint)

    def case(self, kernel: str, shape: str) -> CaseResult | None:
        for c in self.cases:
            if c.kernel == kernel and c.shape == shape:
                return c
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "fingerprint": dict(self.fingerprint),
            "device_peaks": dict(self.device_peaks),
            "suite": self.suite,
            "started_at": self.started_at,
            "extra": dict(self.extra),
            "cases": [c.to_dict() for c in self.cases],
        }

    @classmethod
    def from_dict(cls, d: Any) -> BenchResult:
        d = _mapping(d, "")
        _check_keys(d, "", RESULT_KEYS, required=("schema_version", "fingerprint", "cases"))
        version = _int(d["schema_version"], "schema_version")
        if version != SCHEMA_VERSION:
            raise SchemaError("schema_version", f"unsupported version {version} (this build reads {SCHEMA_VERSION})")
        cases_raw = d["cases"]
        if not isinstance(cases_raw, list):
            raise SchemaError("cases", "expected a list")
        cases = tuple(CaseResult.from_dict(c, f"cases[{i}]") for i, c in enumerate(cases_raw))
        seen: dict[tuple[str, str], int] = {}
        for i, c in enumerate(cases):
            if c.key in seen:
                raise SchemaError(f"cases[{i}]", f"duplicate case {c.kernel}/{c.shape} (first at cases[{seen[c.key]}])")
            seen[c.key] = i
        return cls(
            fingerprint=dict(_mapping(d["fingerprint"], "fingerprint")),
            cases=cases,
            device_peaks=_dict(d.get("device_peaks"), "device_peaks"),
            suite=_str(d.get("suite"), "suite", optional=True),
            started_at=_str(d.get("started_at"), "started_at", optional=True),
            extra=_dict(d.get("extra"), "extra"),
            schema_version=version,  # type: ignore[arg-type]
        )


def kept_on_resume(prior: BenchResult, fingerprint: Mapping[str, Any], settings: Mapping[str, Any],
                   planned: Collection[tuple[str, str]]) -> tuple[CaseResult, ...]:
    """The cases of ``prior`` that a run continuing it keeps, when that run has ``prior``'s environment
    (``fingerprint``, as a result records it), GPU and ``settings`` (seed, rounds, ...: keys of a result's
    ``extra``); otherwise ValueError saying what differs. Of the run's ``planned`` (shape, kernel) cases it
    keeps those that neither failed, lacked a kernel nor ran throttled (a throttled case is no baseline row,
    and throttling passes); every case outside them stays as it was, so that resuming with a narrower
    selection, for the cases a stopped run left, never drops what the file holds."""
    if prior.fingerprint_hash != fingerprint_hash(fingerprint):
        raise ValueError(f"measured in another environment (fingerprint {prior.fingerprint_hash[:12]}, "
                         f"this one {fingerprint_hash(fingerprint)[:12]})")
    if prior.fingerprint.get("gpu_uuid") != fingerprint.get("gpu_uuid"):
        raise ValueError(f"measured on GPU {prior.fingerprint.get('gpu_uuid')}, this run is on "
                         f"{fingerprint.get('gpu_uuid')}")
    for name, value in settings.items():
        if prior.extra.get(name) != value:
            raise ValueError(f"measured with {name} {prior.extra.get(name)!r}, this run has {value!r}")
    return tuple(case for case in prior.cases
                 if (case.shape, case.kernel) not in planned or not (case.error or case.missing or case.throttled))


# ----------------------------------------------------------------------------------------------
# History points (what the history store hands back to ``judge``)


@dataclass(frozen=True)
class HistoryPoint:
    """One earlier run of one case, as the drift rules see it."""

    run_id: int
    started_at: str
    fingerprint_hash: str
    helion_median_ms: float | None
    mamba_ssm_median_ms: float | None
    speedup: float | None


# ----------------------------------------------------------------------------------------------
# Baseline file


@dataclass(frozen=True)
class ImplStats:
    median_ms: float
    p10_ms: float | None = None
    p90_ms: float | None = None
    iqr_ms: float | None = None
    n: int | None = None
    samples_ms: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"median_ms": self.median_ms, "p10_ms": self.p10_ms, "p90_ms": self.p90_ms,
                "iqr_ms": self.iqr_ms, "n": self.n, "samples_ms": list(self.samples_ms)}

    @classmethod
    def from_samples(cls, samples: Iterable[float]) -> ImplStats | None:
        s = stats.summarize(samples)
        if s is None:
            return None
        return cls(_sig(s.median), _sig(s.p10), _sig(s.p90), _sig(s.iqr), s.n,  # type: ignore[arg-type]
                   tuple(_sig(x) for x in samples))  # type: ignore[misc]

    @classmethod
    def from_dict(cls, d: Any, path: str) -> ImplStats:
        d = _mapping(d, path)
        _check_keys(d, path, ("median_ms", "p10_ms", "p90_ms", "iqr_ms", "n", "samples_ms"), required=("median_ms",))
        return cls(
            median_ms=_num(d["median_ms"], _join(path, "median_ms"), positive=True),  # type: ignore[arg-type]
            p10_ms=_num(d.get("p10_ms"), _join(path, "p10_ms"), optional=True, positive=True),
            p90_ms=_num(d.get("p90_ms"), _join(path, "p90_ms"), optional=True, positive=True),
            iqr_ms=_num(d.get("iqr_ms"), _join(path, "iqr_ms"), optional=True, nonneg=True),
            n=_int(d.get("n"), _join(path, "n"), optional=True),
            samples_ms=tuple(_samples(d.get("samples_ms"), _join(path, "samples_ms"))),
        )


BASELINE_CASE_KEYS = ("phase", "seed", "helion", "mamba_ssm", "speedup_vs_mamba_ssm", "precision",
                      "roofline_fraction", "layer_share", "recorded_at", "fingerprint", "timing_method")
BASELINE_PRECISION_KEYS = PRECISION_NUMBERS + ("allclose", "finite")


@dataclass(frozen=True)
class BaselineCase:
    kernel: str
    shape: str
    helion: ImplStats
    mamba_ssm: ImplStats | None
    speedup_vs_mamba_ssm: float | None
    precision: Precision
    phase: str = ""
    roofline_fraction: float | None = None
    layer_share: float | None = None
    seed: int | None = None
    # When, and under which environment (fingerprint hash), this case was measured: a baseline file can
    # hold cases of several runs, e.g. after a re-tune re-baselined only the kernels it tuned.
    recorded_at: str | None = None
    fingerprint: str | None = None
    timing_method: str | None = None  # None: recorded before methods were (mamba2_guard.bench.timing.method)

    @property
    def ratio_samples(self) -> list[float]:
        """Per-round speedups from the stored paired samples (empty when not stored or not paired)."""
        h = self.helion.samples_ms
        m = self.mamba_ssm.samples_ms if self.mamba_ssm else ()
        return stats.paired_ratios(h, m) if h and len(h) == len(m) else []

    def to_dict(self) -> dict[str, Any]:
        prec = {k: getattr(self.precision, k) for k in BASELINE_PRECISION_KEYS}
        return {
            "phase": self.phase, "seed": self.seed,
            "helion": self.helion.to_dict(),
            "mamba_ssm": None if self.mamba_ssm is None else self.mamba_ssm.to_dict(),
            "speedup_vs_mamba_ssm": self.speedup_vs_mamba_ssm,
            "precision": prec,
            "roofline_fraction": self.roofline_fraction,
            "layer_share": self.layer_share,
            "recorded_at": self.recorded_at,
            "fingerprint": self.fingerprint,
            "timing_method": self.timing_method,
        }


@dataclass(frozen=True)
class Baseline:
    fingerprint: dict[str, Any]
    cases: dict[tuple[str, str], BaselineCase]
    device_peaks: dict[str, Any] = field(default_factory=dict)
    schema_version: int = BASELINE_SCHEMA_VERSION
    recorded_at: str | None = None  # when the bench ran (ISO 8601): every number keeps its date

    def get(self, kernel: str, shape: str) -> BaselineCase | None:
        return self.cases.get((kernel, shape))

    def to_dict(self) -> dict[str, Any]:
        results: dict[str, dict[str, Any]] = {}
        for (kernel, shape), c in sorted(self.cases.items()):
            results.setdefault(kernel, {})[shape] = c.to_dict()
        return {"schema_version": self.schema_version, "recorded_at": self.recorded_at,
                "fingerprint": dict(self.fingerprint), "device_peaks": dict(self.device_peaks), "results": results}


def baseline_skip_reason(case: CaseResult) -> str | None:
    """Why a case cannot go into a baseline (None: it can)."""
    if case.missing:
        return "helion implementation missing"
    if case.error:
        return f"error: {case.error}"
    if not case.timings_meaningful:
        return "timings not meaningful (CPU interpret mode)"
    if case.throttled:
        return "throttled"
    if not case.samples_ms.helion:
        return "no helion samples"
    if case.precision is None:
        return "no precision data"
    failure = case.precision.failure()
    return f"precision failure: {failure}" if failure else None


def baseline_from_result(result: BenchResult, *, strict: bool = False) -> dict[str, Any]:
    """The baseline document (a dict ready for YAML) summarising ``result``.

    Cases that cannot be a reference (missing, errored, throttled, interpret-mode timings, failed
    precision) are left out; with ``strict=True`` any such case raises ValueError instead.
    Numbers are rounded to 6 significant digits so that re-writing a baseline gives small diffs.
    """
    cases: dict[tuple[str, str], BaselineCase] = {}
    skipped = []
    for c in result.cases:
        reason = baseline_skip_reason(c)
        if reason:
            skipped.append(f"{c.kernel}/{c.shape}: {reason}")
            continue
        helion = ImplStats.from_samples(c.samples_ms.helion)
        mamba = ImplStats.from_samples(c.samples_ms.mamba_ssm)
        assert helion is not None and c.precision is not None
        cases[c.key] = BaselineCase(
            kernel=c.kernel, shape=c.shape, helion=helion, mamba_ssm=mamba,
            speedup_vs_mamba_ssm=_sig(c.speedup), precision=c.precision, phase=c.phase,
            roofline_fraction=_sig(c.roofline_fraction), layer_share=_sig(c.layer_share), seed=c.seed,
            recorded_at=result.started_at, fingerprint=result.fingerprint_hash, timing_method=c.timing_method,
        )
    if strict and skipped:
        raise ValueError("cases cannot go into a baseline: " + "; ".join(skipped))
    return Baseline(dict(result.fingerprint), cases, dict(result.device_peaks),
                    recorded_at=result.started_at).to_dict()


def load_baseline(doc: Any) -> Baseline:
    """Validate a parsed baseline document; errors name the bad key (``results.k.s.helion.median_ms``)."""
    d = _mapping(doc, "")
    _check_keys(d, "", ("schema_version", "recorded_at", "fingerprint", "device_peaks", "results"),
                required=("fingerprint", "results"))
    version = _int(d.get("schema_version", BASELINE_SCHEMA_VERSION), "schema_version")
    if version != BASELINE_SCHEMA_VERSION:
        raise SchemaError("schema_version",
                          f"unsupported baseline version {version} (this build reads {BASELINE_SCHEMA_VERSION})")
    cases: dict[tuple[str, str], BaselineCase] = {}
    for kernel, shapes in _mapping(d["results"] or {}, "results").items():
        kpath = _join("results", str(kernel))
        for shape, e in _mapping(shapes or {}, kpath).items():
            path = _join(kpath, str(shape))
            e = _mapping(e, path)
            _check_keys(e, path, BASELINE_CASE_KEYS, required=("helion", "speedup_vs_mamba_ssm", "precision"))
            prec_path = _join(path, "precision")
            prec = _mapping(e["precision"], prec_path)
            _check_keys(prec, prec_path, BASELINE_PRECISION_KEYS,
                        required=("max_abs_diff_vs_mamba_ssm", "mean_abs_diff_vs_mamba_ssm", "max_rel_err_vs_fp64"))
            helion = ImplStats.from_dict(e["helion"], _join(path, "helion"))
            mamba_raw = e.get("mamba_ssm")
            mamba = None if mamba_raw is None else ImplStats.from_dict(mamba_raw, _join(path, "mamba_ssm"))
            if helion.samples_ms and mamba and mamba.samples_ms and len(helion.samples_ms) != len(mamba.samples_ms):
                raise SchemaError(_join(_join(path, "mamba_ssm"), "samples_ms"),
                                  "sample count differs from helion's (samples are paired by round)")
            cases[(str(kernel), str(shape))] = BaselineCase(
                kernel=str(kernel), shape=str(shape), helion=helion, mamba_ssm=mamba,
                speedup_vs_mamba_ssm=_num(e["speedup_vs_mamba_ssm"], _join(path, "speedup_vs_mamba_ssm"),
                                          optional=True, positive=True),
                precision=Precision.from_dict(prec, prec_path),
                phase=_str(e.get("phase") or "", _join(path, "phase")) or "",
                roofline_fraction=_num(e.get("roofline_fraction"), _join(path, "roofline_fraction"),
                                       optional=True, nonneg=True),
                layer_share=_num(e.get("layer_share"), _join(path, "layer_share"), optional=True, nonneg=True),
                seed=_int(e.get("seed"), _join(path, "seed"), optional=True),
                recorded_at=_str(e.get("recorded_at"), _join(path, "recorded_at"), optional=True),
                fingerprint=_str(e.get("fingerprint"), _join(path, "fingerprint"), optional=True),
                timing_method=_str(e.get("timing_method"), _join(path, "timing_method"), optional=True),
            )
    return Baseline(
        fingerprint=dict(_mapping(d["fingerprint"] or {}, "fingerprint")),
        cases=cases,
        device_peaks=_dict(d.get("device_peaks"), "device_peaks"),
        schema_version=version,  # type: ignore[arg-type]
        recorded_at=_str(d.get("recorded_at"), "recorded_at", optional=True),
    )
