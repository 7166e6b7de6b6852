#!/usr/bin/env bash
# Build a folder of wheels for an offline GPU runner that already has torch and triton (in a virtualenv, in
# conda or in the system Python): everything else the kernels and the guard need at run time (pyproject.toml's
# dependencies and its `guard` extra, with their own dependencies), nothing only developers need.
#
#   scripts/gpu-wheels.sh OUTDIR [HELION_VERSION] [EXTRA_SPEC...]
#
# Targets CPython $PY_VERSION (default 3.12) on x86_64 Linux. HELION_VERSION defaults to 1.5.0, the newest
# helion that imports on torch 2.11 (1.5.1 needs torch >= 2.12). EXTRA_SPEC are more pip requirement specs.
# mamba-ssm has no wheel on the index: it is built here, pure Python, without its CUDA extension (this needs
# torch importable by $PYTHON, the interpreter running this script).
#
# On the runner:  WHEELS=OUTDIR PYTHON=/path/to/python-with-torch scripts/install.sh
set -euo pipefail
out=${1:?usage: gpu-wheels.sh OUTDIR [HELION_VERSION] [EXTRA_SPEC...]}
helion=${2:-1.5.0}
shift $(( $# >= 2 ? 2 : 1 ))
mkdir -p "$out"
py=${PYTHON:-python3}
platform_args=(--only-binary=:all: --python-version "${PY_VERSION:-3.12}" --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# --no-deps, each dependency named: resolving helion's would download torch. Grouped by who needs them.
"$py" -m pip download -q --no-deps "${platform_args[@]}" -d "$out" \
  "setuptools>=77" wheel \
  "helion==$helion" filecheck psutil scikit-learn joblib threadpoolctl narwhals cloudpickle typing-extensions \
  einops "pyyaml>=6" packaging numpy "scipy>=1.10" "filelock>=3.12" \
  "rich>=13" markdown-it-py mdurl pygments \
  "prometheus-client>=0.19" "apscheduler>=3.10,<4" tzlocal "sqlalchemy>=2" greenlet \
  "gitpython>=3.1" gitdb smmap \
  "pygithub>=2.1" pyjwt pynacl cffi pycparser cryptography requests urllib3 idna certifi charset-normalizer \
  "nvidia-ml-py>=12" \
  "matplotlib>=3.8" contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six tzdata \
  "$@"
if ! ls "$out"/mamba_ssm-*.whl >/dev/null 2>&1; then
  MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
    "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$out" "mamba-ssm==2.3.2.post1"
fi
du -sh "$out"
