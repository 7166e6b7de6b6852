"""A fake bench function for the sharding tests: no GPU, no kernels; deterministic cases.

Behaviour per job from ``spec["extra"]`` merged over ``$FAKE_BENCH_EXTRA`` (JSON), ``jobs[job_id]``
overriding ``default``:
  ``slow``   factor on Helion's samples (a regression against a baseline of the plain run);
  ``sleep``  seconds before the case;
  ``crash``  die by SIGSEGV before the case;
  ``hang``   sleep forever before the case.
The worker's GPU identity is derived from its CUDA_VISIBLE_DEVICES value (``GPU-fake-<value>``).
With ``$FAKE_BENCH_RAN`` set to a path, each job's id is appended to that file as it is measured.
"""

from __future__ import annotations

import json
import os
import signal
import time
import zlib

from mamba2_guard.core.results import CaseResult, Precision, SamplesMs

ROUNDS = 30


def behaviour(spec: dict, job_id: str) -> dict:
    extra = json.loads(os.environ.get("FAKE_BENCH_EXTRA") or "{}")
    extra.update(spec.get("extra") or {})
    return {**extra.get("default", {}), **(extra.get("jobs") or {}).get(job_id, {})}


def make_case(kernel: str, shape: str, seed: int, slow: float = 1.0) -> CaseResult:
    base = 0.1 + (zlib.crc32(f"{kernel}@{shape}".encode()) % 1000) / 1000
    helion = tuple(base * slow * (1 + 0.002 * ((7 * i + seed) % 11)) for i in range(ROUNDS))
    mamba = tuple(base * 1.2 * (1 + 0.002 * ((5 * i + seed) % 13)) for i in range(ROUNDS))
    precision = Precision(mean_abs_diff_vs_mamba_ssm=1e-4, max_abs_diff_vs_mamba_ssm=1e-3, max_rel_err_vs_fp64=2e-3,
                          mamba_ssm_max_rel_err_vs_fp64=2e-3, allclose=True, finite=True, ok=True)
    return CaseResult(kernel=kernel, shape=shape, phase="fwd", seed=seed, samples_ms=SamplesMs(helion, mamba),
                      precision=precision, roofline_fraction=0.5)


def bench(spec: dict, note):
    device = str(spec.get("device") or "0")
    note(gpu={"index": int(device) if device.isdigit() else None, "uuid": f"GPU-fake-{device}", "name": "Fake GPU",
              "fingerprint_digest": "f" * 64}, phase="ready")
    for job in spec["jobs"]:
        b = behaviour(spec, f"{job['kernel']}@{job['shape']}")
        time.sleep(float(b.get("sleep", 0)))
        if b.get("crash"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if b.get("hang"):
            while True:
                time.sleep(1)
        if os.environ.get("FAKE_BENCH_RAN"):
            with open(os.environ["FAKE_BENCH_RAN"], "a") as ran:
                ran.write(f"{job['kernel']}@{job['shape']}\n")
        yield make_case(job["kernel"], job["shape"], int(spec["seed"]), float(b.get("slow", 1.0)))
