"""A sample bench result, verdicts and drift report: what a GPU nightly would leave behind."""

from __future__ import annotations

from typing import Any

FINGERPRINT = {
    "hostname": "gpu-runner-1", "gpu_name": "NVIDIA H200", "gpu_uuid": "GPU-0f1e2d3c-aaaa-bbbb-cccc-000000000001",
    "gpu_index": 0, "compute_capability": "9.0", "sm_count": 132, "memory_bytes": 150754820096,
    "driver_version": "580.65.06", "cuda_runtime": "12.8", "torch": "2.13.0", "triton": "3.8.0", "helion": "1.5.1",
    "mamba_ssm": "2.3.2.post1", "python": "3.12.3", "kernels_source_hash": "ab" * 32, "kernel_sources": {},
}

CASES = [
    ("ssd_chunk_scan_fwd", "nemotron3-nano", 0.50, 0.62, None),
    ("ssd_chunk_state_fwd", "nemotron3-nano", 0.30, 0.33, None),
    ("gated_rmsnorm_bwd", "nemotron3-nano", 0.20, 0.46, None),
    ("causal_conv1d_fwd", "long-context", 0.40, 0.41, None),
]


def result(started_at: str = "2026-09-01T03:17:00+00:00") -> dict[str, Any]:
    cases = []
    for kernel, shape, h, m, _ in CASES:
        cases.append({
            "kernel": kernel, "shape": shape, "phase": "fwd", "seed": 0,
            "samples_ms": {"helion": [h * (1 + 0.01 * i) for i in range(12)],
                           "mamba_ssm": [m * (1 + 0.01 * i) for i in range(12)]},
            "precision": {"mean_abs_diff_vs_mamba_ssm": 1e-4, "max_abs_diff_vs_mamba_ssm": 3e-3,
                          "max_rel_err_vs_fp64": 2e-3, "mamba_ssm_max_rel_err_vs_fp64": 2.5e-3,
                          "allclose": True, "finite": True, "ok": True,
                          "outputs": [{"output": "out", "strays": 2 if kernel == "gated_rmsnorm_bwd" else 0}]},
            "roofline_fraction": 0.6, "layer_share": 0.2, "throttled": False, "error": None, "missing": False,
            "timings_meaningful": True, "extra": {},
        })
    return {"schema_version": 1, "fingerprint": FINGERPRINT, "device_peaks": {}, "suite": "default",
            "started_at": started_at, "extra": {}, "cases": cases}


def verdicts() -> list[dict[str, Any]]:
    out = []
    for kernel, shape, *_ in CASES:
        status = "regression" if kernel == "ssd_chunk_state_fwd" else "ok"
        out.append({"kernel": kernel, "shape": shape, "status": status, "signal": "ratio" if status != "ok" else None,
                    "effect": 0.08 if status != "ok" else None, "p_value": 0.001 if status != "ok" else None,
                    "confirmed": status != "ok", "detail": "", "phase": "fwd", "environment": False, "evidence": {}})
    return out


def drift() -> dict[str, Any]:
    return {"found": True, "action": "retune", "classes": ["software"], "gpu_name": "NVIDIA H200", "notes": [],
            "items": [{"class": "software", "component": "helion", "before": "1.5.0", "after": "1.5.1",
                       "action": "retune", "reference": ["configs"], "detail": ""}]}


def snapshot() -> dict[str, Any]:
    from mamba2_guard.adapters.metrics import snapshot as make

    return make(result(), verdicts(), None, drift(), events={"drift": 1788230000.0, "pr": 1788233600.0,
                                                             "retune": 1788230100.0},
                autotune_s={"ssd_chunk_state_fwd": 812.0})


def metrics():
    """A GuardMetrics filled the way the daemon fills it after a nightly."""
    import time

    from mamba2_guard.adapters.metrics import GuardMetrics

    m = GuardMetrics()
    m.update_from_result(result(), verdicts(), None, drift())
    now = time.time()
    for job, status in (("nightly", "success"), ("nightly", "regression"), ("drift", "success"),
                        ("retune", "timeout")):
        m.record_run(job, status, now - 60, now)
    m.record_run("nightly", "missed", now, now)
    for event in ("drift", "retune", "pr"):
        m.record_event(event, now - 3600)
    m.record_pr_opened()
    m.record_autotune("ssd_chunk_state_fwd", 812.0)
    m.record_state_error("jobs.sqlite")
    return m
