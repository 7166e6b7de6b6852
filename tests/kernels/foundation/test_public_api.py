"""The public API as a training job uses it: ``import mamba2_kernels`` in a fresh process, no test helpers, CPU
tensors."""

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

    import mamba2_kernels

    assert "mamba2_kernels.testing" not in sys.modules
    torch.manual_seed(0)
    b, l, h, p, g, n = 1, 64, 2, 8, 1, 16
    x = torch.randn(b, l, h, p, requires_grad=True)
    dt, A = torch.rand(b, l, h), -torch.rand(h)
    B, C = torch.randn(b, l, g, n), torch.randn(b, l, g, n)
    y = mamba2_kernels.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=32, dt_softplus=True)
    y.sum().backward()
    assert y.shape == x.shape and torch.isfinite(x.grad).all()

    xc, w = torch.randn(2, 16, 40), torch.randn(16, 4)
    assert mamba2_kernels.causal_conv1d_fn(xc, w, activation="silu").shape == xc.shape

    xn, z = torch.randn(4, 32), torch.randn(4, 32)
    assert mamba2_kernels.rmsnorm_fn(xn, torch.ones(32), None, z=z).shape == xn.shape
    assert mamba2_kernels.RMSNormGated(32, group_size=16)(xn, z).shape == xn.shape
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


def _only(distributions: set[str], into: Path) -> Path:
    """A folder holding links to the installed files of ``distributions`` alone (their top-level packages,
    modules and metadata): on ``sys.path`` without site-packages, a fresh environment with only those."""
    from importlib import metadata

    into.mkdir()
    for name in sorted(distributions):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}:
            target = Path(str(dist.locate_file(top)))
            if target.exists() and not (into / top).exists():
                (into / top).symlink_to(target)
    return into


@pytest.mark.slow
def test_a_training_job_needs_only_the_declared_dependencies(tmp_path):
    """`pip install mamba2-guard` into a job's environment brings the base dependencies and what they declare;
    the public functions must run on those alone (helion imports `packaging` without declaring it)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from tests.distributions import closure, name_of

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    site = _only(closure({name_of(spec) for spec in declared}), tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "HELION_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(site)])
    done = subprocess.run([sys.executable, "-S", "-c", USER_CODE], capture_output=True, text=True, timeout=600,
                          env=env, cwd=REPO)  # -S: no site-packages, only the links
    assert done.returncode == 0, done.stderr[-3000:]
    assert "public API ok" in done.stdout


def test_public_names_are_listed():
    import mamba2_kernels

    public = set(mamba2_kernels.__all__)
    assert {"causal_conv1d_fn", "rmsnorm_fn", "RMSNormGated", "mamba_chunk_scan_combined"} <= public


def test_dir_lists_the_public_names_though_they_load_lazily():
    import mamba2_kernels

    names = dir(mamba2_kernels)
    assert {"mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined", "rmsnorm_fn", "causal_conv1d_fn",
            "patch_mamba_ssm"} <= set(names)
    assert names == sorted(names)
