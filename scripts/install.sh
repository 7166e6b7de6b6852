#!/usr/bin/env bash
# The one install path, for a fresh CPU machine and for a GPU runner that already has torch.
#
#   scripts/install.sh            # creates .venv (or $VENV) and installs mamba2-guard with its dev extra
#
# Environment:
#   VENV=DIR          where the virtual environment goes (default: .venv in the repository)
#   PYTHON=python3.X  the interpreter that creates it (default: python3)
#   WHEELS=DIR        offline: install only from this folder of wheels (shared/tools/gpu-wheels.sh builds one)
#
# If $PYTHON already imports torch (a GPU runner), the venv sees its site-packages, so that torch and
# triton are reused; otherwise the CPU wheel of torch is installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$root/.venv}
base_python=${PYTHON:-python3}
cpu_torch="torch==2.13.0"
cpu_triton="triton==3.8.0"   # runs Triton's CPU interpreter for the tests
mamba_ssm="mamba-ssm==2.3.2.post1"

pip_args=(-q --disable-pip-version-check)
if [ -n "${WHEELS:-}" ]; then pip_args+=(--no-index --find-links "$WHEELS"); fi

if [ ! -x "$venv/bin/python" ]; then
  venv_args=()
  if "$base_python" -c "import torch" >/dev/null 2>&1; then venv_args+=(--system-site-packages); fi
  "$base_python" -m venv "${venv_args[@]}" "$venv"
fi
py="$venv/bin/python"
pip() { "$py" -m pip "$@"; }
has() { "$py" -c "import $1" >/dev/null 2>&1; }

[ -n "${WHEELS:-}" ] || pip install "${pip_args[@]}" --upgrade pip setuptools wheel
has torch || pip install "${pip_args[@]}" "$cpu_torch"
has triton || pip install "${pip_args[@]}" "$cpu_triton"

# mamba-ssm: its setup.py downloads a CUDA wheel unless forced to build, fails on CPU torch without
# MAMBA_SKIP_CUDA_BUILD, and pulls GBs of unneeded deps; the SSD and norm kernels need only einops + triton.
if ! "$py" - <<'PY' >/dev/null 2>&1
from importlib.metadata import version
assert version("mamba-ssm").startswith("2.3.")
PY
then
  pip install "${pip_args[@]}" packaging ninja einops setuptools wheel
  MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
    pip install "${pip_args[@]}" --no-build-isolation --no-deps "$mamba_ssm"
fi

# The project's own dependencies, less those handled above, then the project itself without deps
# (a plain `pip install .` would resolve mamba-ssm's GPU-only requirements).
has tomllib || pip install "${pip_args[@]}" tomli
mapfile -t deps < <("$py" - "$root/pyproject.toml" <<'PY'
import re, sys
try:
    import tomllib
except ModuleNotFoundError:
    import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
handled = {"torch", "triton", "mamba-ssm"}
for spec in project["dependencies"] + project["optional-dependencies"]["dev"]:
    if re.split(r"[<>=!~ \[;]", spec, maxsplit=1)[0].lower() not in handled:
        print(spec)
PY
)
pip install "${pip_args[@]}" "${deps[@]}"
pip install "${pip_args[@]}" --no-deps --no-build-isolation -e "$root"
"$py" -m guard doctor --quiet
