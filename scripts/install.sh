#!/usr/bin/env bash
# The one install path, for a fresh CPU machine and for a GPU runner that already has torch.
#
#   scripts/install.sh            # creates .venv (or $VENV) and installs mamba2-guard with its extras
#
# Environment:
#   VENV=DIR          where the virtual environment goes (default: .venv in the repository)
#   PYTHON=python3.X  the interpreter that creates it (default: python3)
#   WHEELS=DIR        offline: install only from this folder of wheels (scripts/gpu-wheels.sh builds one)
#   EXTRAS=guard,dev  the extras of pyproject.toml to install (default: guard,dev; with WHEELS: guard)
#
# If $PYTHON already imports torch (a GPU runner: torch in a virtualenv, in conda or in the system
# Python), the new venv sees that interpreter's packages through a .pth file listing its site-packages
# folders, so that torch and triton are reused; otherwise the CPU wheel of torch is installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$root/.venv}
base_python=${PYTHON:-python3}
cpu_torch="torch==2.13.0"
cpu_triton="triton==3.8.0"   # runs Triton's CPU interpreter for the tests
mamba_ssm="mamba-ssm==2.3.2.post1"

pip_args=(-q --disable-pip-version-check)
step() { echo "install: $*"; }
extras=guard,dev
if [ -n "${WHEELS:-}" ]; then pip_args+=(--no-index --find-links "$WHEELS"); extras=guard; fi
extras=${EXTRAS:-$extras}

if [ ! -x "$venv/bin/python" ]; then
  step "creating the virtual environment $venv"
  if "$base_python" -c "import torch" >/dev/null 2>&1; then
    # --system-site-packages reaches only the base installation's folders, not a venv's or what its own .pth
    # files add: list every site-packages folder on the interpreter's path instead (pip and setuptools
    # included: ensurepip's older ones would shadow them).
    "$base_python" -m venv --without-pip "$venv"
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$base_python" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
      > "$site/_mamba2_guard_base.pth"
  else
    "$base_python" -m venv "$venv"
  fi
fi
py="$venv/bin/python"
pip() { "$py" -m pip "$@"; }
has() { "$py" -c "import $1" >/dev/null 2>&1; }

has pip || "$py" -m ensurepip -q
if [ -n "${WHEELS:-}" ]; then
  pip install "${pip_args[@]}" "setuptools>=77" wheel   # pyproject.toml's build requirements
else
  pip install "${pip_args[@]}" --upgrade pip setuptools wheel
fi
has torch && step "reusing $("$py" -c 'import torch; print("torch", torch.__version__)')" \
  || { step "$cpu_torch, the CPU wheel (about 200 MB)"; pip install "${pip_args[@]}" "$cpu_torch"; }
has triton || { step "$cpu_triton (its CPU interpreter runs the tests)"; pip install "${pip_args[@]}" "$cpu_triton"; }

# mamba-ssm: its setup.py downloads a CUDA wheel unless forced to build, fails on CPU torch without
# MAMBA_SKIP_CUDA_BUILD, and pulls GBs of unneeded deps; the SSD and norm kernels need only einops + triton.
if ! "$py" - <<'PY' >/dev/null 2>&1
from importlib.metadata import version
assert version("mamba-ssm").startswith("2.3.")
PY
then
  step "$mamba_ssm without its CUDA build or its dependencies: only its Triton kernels are used, so its" \
    "GPU-only requirements (causal-conv1d, transformers, ...) are left out on purpose"
  pip install "${pip_args[@]}" packaging ninja einops setuptools wheel
  MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
    pip install "${pip_args[@]}" --no-build-isolation --no-deps "$mamba_ssm"
fi

# The project's own dependencies, less those handled above, then the project itself without deps
# (a plain `pip install .` would resolve mamba-ssm's GPU-only requirements).
has tomllib || pip install "${pip_args[@]}" tomli
mapfile -t deps < <("$py" - "$root/pyproject.toml" "$extras" <<'PY'
import re, sys
try:
    import tomllib
except ModuleNotFoundError:
    import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
handled = {"torch", "triton", "mamba-ssm"}
extras = [project["optional-dependencies"][name] for name in sys.argv[2].split(",") if name]
for spec in project["dependencies"] + sum(extras, []):
    if re.split(r"[<>=!~ \[;]", spec, maxsplit=1)[0].lower() not in handled:
        print(spec)
PY
)
# --no-warn-conflicts: pip would print a red resolver ERROR about those requirements of mamba-ssm.
step "the dependencies of mamba2-guard and its extras ($extras)"
pip install "${pip_args[@]}" --no-warn-conflicts "${deps[@]}"
step "mamba2-guard itself (editable), then its doctor"
pip install "${pip_args[@]}" --no-warn-conflicts --no-deps --no-build-isolation -e "$root"
"$py" -m mamba2_guard doctor --quiet
