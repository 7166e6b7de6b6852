"""A whole call's device time kernel by kernel (``mamba2_guard.core.kernel_time_table``), and the tool's command
line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mamba2_guard.core.kernel_time_table import KernelTime, per_call, table


def test_events_of_several_calls_fold_into_one_row_per_kernel_per_call():
    events = [("scan", 300.0), ("state", 100.0), ("state", 120.0), ("scan", 280.0), ("state", 90.0),
              ("state", 110.0)]  # two calls: scan once, state twice in each
    assert per_call(events, calls=2) == [KernelTime("scan", 0.29, 1), KernelTime("state", 0.21, 2)]
    assert per_call([("b", 1.0), ("a", 1.0)], calls=1)[0].name == "a"  # ties by name
    with pytest.raises(ValueError, match="calls: expected >= 1"):
        per_call(events, calls=0)


def test_the_table_ranks_each_side_with_shares_and_folds_the_tail():
    sides = {"ours": [KernelTime("scan", 0.3, 1), KernelTime("state", 0.1, 2)],
             "mamba-ssm": [KernelTime(f"k{i}", 0.1, 1) for i in range(4)]}
    lines = table(sides, top=2).splitlines()
    assert lines[0] == "ours: 0.4000 ms per call, 3 launches"
    assert "75.0%" in lines[1] and lines[1].endswith("scan") and "x2" in lines[2]
    assert lines[3] == "mamba-ssm: 0.4000 ms per call, 4 launches"
    assert "50.0%" in lines[6] and lines[6].endswith("2 more kernels")


def test_the_command_names_bad_arguments_and_needs_a_gpu():
    def run(*argv):
        return subprocess.run([sys.executable, "-m", "mamba2_guard", "dev", "kernel-times", *argv], capture_output=True,
                              text=True, timeout=120)

    bad = run("--calls", "0")
    assert bad.returncode == 2 and "--calls" in bad.stderr and "Traceback" not in bad.stderr
    unknown = run("--shapes", "no-such-shape")
    assert unknown.returncode == 2 and "no-such-shape" in unknown.stderr and "Traceback" not in unknown.stderr
    no_gpu = run("--shapes", "smoke")
    assert no_gpu.returncode == 2 and "needs a CUDA GPU" in no_gpu.stderr
