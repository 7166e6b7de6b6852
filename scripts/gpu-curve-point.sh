#!/usr/bin/env bash
# One point of a bring-up's anytime curve (issue 50's measurement) on a device machine that starts bare: the
# whole SSD call benched against mamba-ssm at the zoo's shapes on the state a bring-up night left
# (scripts/gpu-bringup-night.sh's OUTDIR/state.tgz), with the GPU's file withheld as the bring-up ran it.
# The configs ours selects are first compiled in parallel processes (`dev warm`, ours only: mamba-ssm's
# autotune would time its candidates against each other under that contention and keep the picks), so that
# the bench, one shape at a time, mostly times; on a bare machine its first call at each shape compiled for
# 30-110 s.
#
#   scripts/gpu-curve-point.sh OUTDIR STATE_TGZ [SECONDS]
#
# SECONDS: this call's wall-clock limit (default 570). SHAPES: the shapes (default: the suites zoo-fit and
# zoo-steered, the third target's). RESUME: an earlier call's OUTDIR/curve.json to continue (`bench
# --resume`), for a zoo that outlasts one call. Needs PYTHONPATH with the guard's wheels.
set -uo pipefail
usage="usage: gpu-curve-point.sh OUTDIR STATE_TGZ [SECONDS]"
out=${1:?$usage}
restore=${2:?$usage}
limit=${3:-570}
mkdir -p "$out"
exec > >(tee -a "$out/curve.log") 2>&1
tar xzf "$restore" || exit 2
picks=.gpu/state/mamba-ssm-autotune-picks.tgz
if [[ -f $picks ]]; then tar xzPf "$picks" || exit 2; fi
slug=$(python3 -c 'from mamba2_guard.adapters import fingerprint as f; print(f.gpu_slug(f.collect()))') || exit 2
export MAMBA2_GUARD_GPU_SLUG=$slug-withheld MAMBA2_GUARD_BORROW=0
shapes=${SHAPES:-$(python3 -c 'from mamba2_kernels import suites
s = suites.load()
print(*(spec.name for name in ("zoo-fit", "zoo-steered") for spec in s.suite(name)))')} || exit 2
echo "curve point on $slug (file withheld), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader
python3 -c 'from importlib.metadata import version as v; print(*(f"{p} {v(p)}" for p in ("torch", "triton", "helion", "mamba-ssm")))'
resume=()
if [[ -n ${RESUME:-} ]]; then cp "$RESUME" "$out/curve.json" && resume=(--resume); fi
# shellcheck disable=SC2086  # $shapes is a list of names
timeout $(( limit / 3 )) python3 -m mamba2_guard dev warm --shapes $shapes --processes "$(nproc)" > "$out/warm.json"
echo "warm exit $? after $SECONDS s"
# shellcheck disable=SC2086
timeout $(( limit - SECONDS - 20 )) python3 -m mamba2_guard bench --shapes $shapes --kernels ssd_combined_fwd_bwd \
  --rounds 10 --state-dir .gpu/state --json "$out/curve.json" "${resume[@]}"
echo "bench exit $? after $SECONDS s"
find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" /tmp/torchinductor_* -name '*.autotune.json' -print0 2>/dev/null \
  | tar czPf "$out/mamba-ssm-autotune-picks.tgz" --null -T -
