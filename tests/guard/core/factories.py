"""Injected samples for the core tests: cases, baselines and history without a GPU."""

from __future__ import annotations

import numpy as np

from mamba2_guard.core.results import (
    BenchResult,
    CaseResult,
    HistoryPoint,
    Precision,
    SamplesMs,
    baseline_from_result,
    load_baseline,
)

GOOD = Precision(
    mean_abs_diff_vs_mamba_ssm=1e-4, max_abs_diff_vs_mamba_ssm=2e-3, max_rel_err_vs_fp64=1e-3,
    mamba_ssm_max_rel_err_vs_fp64=1e-3, allclose=True, finite=True,
)
FINGERPRINT = {"gpu_name": "NVIDIA H200", "driver_version": "580.1", "torch": "2.11.0", "helion": "1.5.0"}


def make_case(rng: np.random.Generator, *, n: int = 30, noise: float = 0.01, helion_ms: float = 1.0,
              mamba_ms: float = 1.3, helion_shift: float = 1.0, mamba_shift: float = 1.0,
              common: float = 0.0, kernel: str = "k", shape: str = "s", phase: str = "fwd",
              **fields) -> CaseResult:
    """Interleaved rounds: each impl gets lognormal noise, plus an optional per-round factor shared
    by both (clock wander within a run)."""
    shared = np.exp(rng.normal(0.0, common, n)) if common else np.ones(n)
    h = helion_ms * helion_shift * shared * np.exp(rng.normal(0.0, noise, n))
    m = mamba_ms * mamba_shift * shared * np.exp(rng.normal(0.0, noise, n))
    fields.setdefault("precision", GOOD)
    return CaseResult(kernel, shape, phase, SamplesMs(tuple(map(float, h)), tuple(map(float, m))), **fields)


def baseline_of(*cases: CaseResult, fingerprint=None):
    """The loaded baseline that ``bench --update-baseline`` would write for these cases."""
    return load_baseline(baseline_from_result(BenchResult(dict(fingerprint or FINGERPRINT), tuple(cases))))


def base_case(case: CaseResult):
    return baseline_of(case).get(case.kernel, case.shape)


def history(speedups, helion_ms=None, fp: str = "fp", start_id: int = 1) -> list[HistoryPoint]:
    """History points with the given per-run speedups (and Helion medians, default 1 ms)."""
    helion_ms = helion_ms if helion_ms is not None else [1.0] * len(speedups)
    return [HistoryPoint(start_id + i, f"2026-09-{1 + i % 28:02d}T03:00:00+00:00", fp, h, h * s, s)
            for i, (s, h) in enumerate(zip(speedups, helion_ms, strict=True))]
