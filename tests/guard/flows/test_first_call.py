"""``mamba2-guard dev first-call``: a job's cold start at a shape, ours and mamba-ssm's, each in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from guard.flows import selection

ROOT = Path(__file__).resolve().parents[3]


def test_fresh_runs_every_job_in_a_new_process():
    # A first call timed in a process that already ran another shape would find its kernels loaded.
    assert len(set(selection.in_parallel(os.getpid, [(), (), ()], 1, fresh=True))) == 3
    assert len(set(selection.in_parallel(os.getpid, [(), (), ()], 1))) == 1


def test_the_tool_times_both_sides_at_a_shape(tmp_path):
    done = subprocess.run([sys.executable, "-m", "guard", "dev", "first-call", "--shapes", "smoke", "--entries",
                           "ssd_combined_fwd"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MAMBA2_GUARD_STATE": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    seconds = json.loads(done.stdout.splitlines()[-1])
    assert set(seconds) == {"smoke"} and set(seconds["smoke"]) == {"helion", "mamba_ssm"}
    assert all(isinstance(value, float) and value > 0 for value in seconds["smoke"].values()), seconds
    assert done.stdout.startswith("smoke helion ")
