#!/usr/bin/env bash
# Build a wheel of causal-conv1d (Tri Dao's CUDA extension, the optional dependency of
# mamba-ssm 2.3.2.post1: it provides causal_conv1d.cpp_functions.causal_conv1d_{fwd,bwd}_function)
# on a machine WITHOUT a GPU, for an offline GPU host that has no compiler and no network.
#
# Target host (defaults): CPython 3.12, x86_64 Linux, torch 2.11.0+cu130 (CUDA 13.0, C++11 ABI),
# NVIDIA H200 (sm_90). The wheel is compiled for the archs in ARCH_LIST only (SASS, no PTX).
#
#   scripts/build-causal-conv1d-wheel.sh OUTDIR [CC_VERSION=1.7.0] [TORCH_VERSION=2.11.0] [ARCH_LIST=9.0]
#
#   ARCH_LIST: TORCH_CUDA_ARCH_LIST style, ';' or ' ' separated, e.g. "9.0" or "8.0;9.0a" ("+PTX" adds PTX).
#
# Needs here: PyPI (pip), nvcc of the SAME CUDA major as the torch wheel (PyPI's torch 2.11.0 is cu130,
# so CUDA 13.x nvcc), a host C++ compiler, python3.12 ($PYTHON), ~6 GB disk in $BUILD_DIR (torch + its
# nvidia-* wheels are installed so that setup.py can import torch). Takes 20-40 min on 2 cores.
# Environment: PYTHON (default python3.12), BUILD_DIR (default /tmp/ccbuild), MAX_JOBS (default 2),
#              CUDA_HOME (default: derived from `nvcc` on PATH).
#
# Install on the GPU host (torch 2.11.0+cu130 already there; no network needed):
#   python3 -m pip install --no-index --no-deps --target SITE .whl/causal_conv1d-*.whl
# (or without --target into the active environment). Check: python3 -c "import causal_conv1d_cuda"
set -euo pipefail

outdir=${1:?usage: $0 OUTDIR [CC_VERSION] [TORCH_VERSION] [ARCH_LIST]}
cc_version=${2:-1.7.0}
torch_version=${3:-2.11.0}
arch_list=${4:-9.0}
python=${PYTHON:-python3.12}
build_dir=${BUILD_DIR:-/tmp/ccbuild}
export MAX_JOBS=${MAX_JOBS:-2}

mkdir -p "$outdir" "$build_dir/dl"
outdir=$(cd "$outdir" && pwd)
cd "$build_dir"

# CUDA_HOME from the nvcc on PATH (follows wrapper scripts such as `exec /usr/local/cuda-13.0/bin/nvcc`).
if [ -z "${CUDA_HOME:-}" ]; then
  nvcc_dir=$(dirname "$(readlink -f "$(command -v nvcc)")")
  if [ -f "$(command -v nvcc)" ] && grep -q '^exec ' "$(command -v nvcc)"; then
    nvcc_dir=$(dirname "$(sed -n 's/^exec \([^ ]*\).*/\1/p' "$(command -v nvcc)")")
  fi
  export CUDA_HOME=$(dirname "$nvcc_dir")
fi
export PATH="$CUDA_HOME/bin:$PATH"
nvcc_major=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
echo "CUDA_HOME=$CUDA_HOME (nvcc CUDA $nvcc_major)"

# 1. A venv with torch (with its deps: `import torch` needs libcudnn etc. even without a GPU) and build deps.
[ -x venv/bin/python ] || "$python" -m venv venv
py=$build_dir/venv/bin/python
if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  "$py" -m pip download -q --no-deps --only-binary :all: "torch==$torch_version" -d dl
  "$py" -m pip install -q dl/torch-"$torch_version"-cp*.whl "setuptools<82"   # torch 2.11 pins setuptools<82
fi
"$py" -m pip install -q ninja packaging wheel "setuptools<82"
torch_cuda=$("$py" -c "import torch; print(torch.version.cuda)")
echo "torch $("$py" -c 'import torch; print(torch.__version__)'), torch.version.cuda=$torch_cuda"
# torch.utils.cpp_extension refuses an nvcc of another CUDA major; the host's torch must match anyway.
if [ "${torch_cuda%%.*}" != "$nvcc_major" ]; then
  echo "torch is CUDA $torch_cuda but nvcc is CUDA $nvcc_major: use a matching nvcc or torch wheel" >&2
  exit 1
fi

# 2. The sdist (its metadata step imports torch, hence --no-build-isolation), unpacked afresh.
"$py" -m pip download -q --no-deps --no-binary :all: --no-build-isolation "causal-conv1d==$cc_version" -d dl
src=$build_dir/causal_conv1d-$cc_version
rm -rf "$src" && tar xzf "dl/causal_conv1d-$cc_version.tar.gz"

# setup.py hard-codes a -gencode list per CUDA version (sm_75..sm_121 for CUDA 13), which also makes torch
# ignore TORCH_CUDA_ARCH_LIST. Replace that list with ARCH_LIST only: smaller wheel, much faster build.
ARCH_LIST=$arch_list "$py" - "$src/setup.py" <<'EOF'
import os, re, sys
path = sys.argv[1]
text = open(path).read()
flags = []
for a in re.split(r"[;\s]+", os.environ["ARCH_LIST"].strip()):
    ptx = a.endswith("+PTX")
    num = a.removesuffix("+PTX").replace(".", "")
    flags += ["-gencode", f"arch=compute_{num},code=sm_{num}"]
    if ptx:
        flags += ["-gencode", f"arch=compute_{num},code=compute_{num}"]
# from the first hard-coded -gencode to the last code=sm_NNN line of the CUDA branch
pat = re.compile(r'( *)cc_flag\.append\("-gencode"\)\n.*code=sm_\d+"\)\n', re.S)
m = pat.search(text)
if not m:
    sys.exit("setup.py: hard-coded -gencode list not found; patch it by hand")
new = f"{m.group(1)}cc_flag.extend({flags!r})  # patched: ARCH_LIST only\n"
open(path, "w").write(text[:m.start()] + new + text[m.end():])
print("setup.py gencode ->", flags)
EOF

# 3. Build (no network: FORCE_BUILD skips setup.py's GitHub prebuilt-wheel download).
cd "$src"
start=$(date +%s)
CAUSAL_CONV1D_FORCE_BUILD=TRUE TORCH_CUDA_ARCH_LIST="$arch_list" \
  nice -n 19 "$py" -m pip wheel -v --no-deps --no-build-isolation -w dist .
echo "build took $(( $(date +%s) - start )) s"
whl=$(ls dist/causal_conv1d-"$cc_version"-*.whl)

# 4. Check: the extension's NEEDED libs must all come with a torch cuXXX install (libcudart.so.<torch major>).
tmp=$(mktemp -d) && "$py" -m zipfile -e "$whl" "$tmp"
so=$(ls "$tmp"/causal_conv1d_cuda*.so)
readelf -d "$so" | grep NEEDED
if readelf -d "$so" | grep NEEDED | grep -q 'libcudart\.so' \
   && ! readelf -d "$so" | grep NEEDED | grep -q "libcudart\.so\.$nvcc_major\]"; then
  echo "unexpected libcudart in $so" >&2; exit 1
fi
rm -rf "$tmp"
cp "$whl" "$outdir/"
ls -l "$outdir/$(basename "$whl")"
