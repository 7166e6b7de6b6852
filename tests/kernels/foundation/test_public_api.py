"""The public API as a training job uses it: ``import kernels`` in a fresh process, no test helpers, CPU tensors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

USER_CODE = textwrap.dedent("""
    import sys

    import torch

    import kernels

    assert "kernels.testing" not in sys.modules
    torch.manual_seed(0)
    b, l, h, p, g, n = 1, 64, 2, 8, 1, 16
    x = torch.randn(b, l, h, p, requires_grad=True)
    dt, A = torch.rand(b, l, h), -torch.rand(h)
    B, C = torch.randn(b, l, g, n), torch.randn(b, l, g, n)
    y = kernels.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=32, dt_softplus=True)
    y.sum().backward()
    assert y.shape == x.shape and torch.isfinite(x.grad).all()

    xc, w = torch.randn(2, 16, 40), torch.randn(16, 4)
    assert kernels.causal_conv1d_fn(xc, w, activation="silu").shape == xc.shape

    xn, z = torch.randn(4, 32), torch.randn(4, 32)
    assert kernels.rmsnorm_fn(xn, torch.ones(32), None, z=z).shape == xn.shape
    assert kernels.RMSNormGated(32, group_size=16)(xn, z).shape == xn.shape
    print("public API ok")
""")


@pytest.mark.slow
def test_public_functions_in_a_fresh_process():
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "HELION_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", USER_CODE], capture_output=True, text=True, timeout=600, env=env,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "public API ok" in done.stdout


def test_public_names_are_listed():
    import kernels

    assert {"causal_conv1d_fn", "rmsnorm_fn", "RMSNormGated", "mamba_chunk_scan_combined"} <= set(kernels.__all__)
