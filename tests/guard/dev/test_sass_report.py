"""mamba2_guard.dev.sass (``mamba2-guard dev sass``): offline SASS of an entry's kernels (Triton's own compiler,
no GPU). Run in a fresh process, as its docstring asks:
this test process has the CPU interpreter's libdevice patches."""

from __future__ import annotations

import json
import subprocess
import sys

COMMAND = [sys.executable, "-m", "mamba2_guard", "dev", "sass"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=600)


def test_fast_sigmoid_lowers_to_mufu_ex2_and_rsq_and_the_exact_one_divides(tmp_path):
    out = tmp_path / "sass.json"
    done = _run("causal_conv1d_fwd", "chunk_scan_bwd_dz", "--shape", "smoke", "--out", str(tmp_path / "code"),
                "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    reports = json.loads(out.read_text())
    (conv,), (dz,) = reports["causal_conv1d_fwd"], reports["chunk_scan_bwd_dz"]
    for report in (conv, dz):
        assert report["instructions"] == sum(report["opcodes"].values()) > 0 and report["registers"] > 0
    # fastmath.sigmoid: exp2 and rsqrt, no reciprocal; torch.sigmoid (dz keeps it): a reciprocal, no rsqrt
    assert conv["opcodes"].get("MUFU.EX2") and conv["opcodes"].get("MUFU.RSQ") and "MUFU.RCP" not in conv["opcodes"]
    assert dz["opcodes"].get("MUFU.RCP") and "MUFU.RSQ" not in dz["opcodes"]
    assert "conv1d_fwd_kernel" in (tmp_path / "code" / "causal_conv1d_fwd" / "causal_conv1d_fwd.py").read_text()
    assert (tmp_path / "code" / "causal_conv1d_fwd" / "causal_conv1d_fwd.sass").read_text().count("MUFU.RSQ")


def test_an_unknown_entry_is_named():
    done = _run("no_such_kernel", "--shape", "smoke")
    assert done.returncode == 2 and "ENTRY: expected one of" in done.stderr and "'no_such_kernel'" in done.stderr
