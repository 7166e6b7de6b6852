"""scripts/install.sh on a runner whose torch lives in a virtualenv: the guard's venv reuses that torch.

No download: the "runner's" venv reaches the CPU torch of the environment running the tests through a .pth
file, and the wheel folder is empty, so pip has nothing to fetch and every requirement must already be met.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.distributions import closure, name_of

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def _site_packages(venv: Path) -> Path:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@pytest.mark.slow
def test_install_reuses_torch_of_a_virtualenv_offline(tmp_path):
    runner = tmp_path / "torch-venv"  # the runner's interpreter: a venv holding torch
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(runner)], check=True)
    ours = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    (_site_packages(runner) / "torch_env.pth").write_text("\n".join(ours) + "\n")
    assert sysconfig.get_paths()["purelib"] in ours
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    guard_venv = tmp_path / "guard-venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=str(runner / "bin" / "python"), VENV=str(guard_venv), WHEELS=str(wheels))
    done = subprocess.run([str(REPO / "scripts" / "install.sh")], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # each step says what it does; pip's resolver ERROR about mamba-ssm's skipped requirements is not printed
    steps = [line for line in done.stdout.splitlines() if line.startswith("install: ")]
    assert steps[0] == f"install: creating the virtual environment {guard_venv}"
    assert steps[1].startswith("install: reusing torch ") and steps[-1].startswith("install: mamba2-guard itself")
    assert "ERROR" not in done.stderr
    probe = subprocess.run([str(guard_venv / "bin" / "python"), "-c",
                            "import torch, mamba2_guard; print(torch.__file__); print(mamba2_guard.__file__)"],
                           capture_output=True, text=True, env=env, check=True).stdout.split()
    assert not probe[0].startswith(str(guard_venv)), "torch was installed again instead of reused"
    assert probe[1].startswith(str(REPO))
    doctor = subprocess.run([str(guard_venv / "bin" / "mamba2-guard"), "doctor"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert doctor.returncode == 0 and "environment ok" in doctor.stdout, doctor.stderr


def test_gpu_wheels_covers_the_runtime_and_no_dev_tool():
    text = (REPO / "scripts" / "gpu-wheels.sh").read_text()
    listed = {name_of(s) for s in re.findall(r'"?[A-Za-z][\w.-]*(?:[<>=][^"\s]*)?"?', text.split("-d \"$out\"")[1]
                                                                                    .split('"$@"')[0])}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = {name_of(s) for s in project["dependencies"] + project["optional-dependencies"]["guard"]}
    on_the_runner = closure({"torch", "triton"})  # the runner has these and what they need
    needed = closure(runtime - {"torch", "triton", "mamba-ssm"}) - on_the_runner - {"mamba-ssm"}
    assert needed - listed == set()
    dev = {name_of(s) for s in project["optional-dependencies"]["dev"]}
    assert listed & dev == set()
