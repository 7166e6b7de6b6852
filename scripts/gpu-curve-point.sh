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
# --resume`), for a zoo that outlasts one call; with SHAPES naming the shapes it left, only those are warmed
# and benched, and the file keeps the others (one the bench would refuse to continue: a new file). Needs
# PYTHONPATH with the guard's wheels.
set -uo pipefail
# shellcheck source=scripts/gpu-machine.sh
source "${BASH_SOURCE[0]%/*}/gpu-machine.sh"
usage="usage: gpu-curve-point.sh OUTDIR STATE_TGZ [SECONDS]"
out=${1:?$usage}
restore=${2:?$usage}
limit=${3:-570}
mkdir -p "$out"
exec > >(tee -a "$out/curve.log") 2>&1
tar xzf "$restore" || exit 2
restore_mamba_ssm_picks
slug=$(gpu_slug) || exit 2
export MAMBA2_GUARD_GPU_SLUG=$slug-withheld MAMBA2_GUARD_BORROW=0
shapes=${SHAPES:-$(python3 -c 'from mamba2_kernels import suites
s = suites.load()
print(*(spec.name for name in ("zoo-fit", "zoo-steered") for spec in s.suite(name)))')} || exit 2
echo "curve point on $slug (file withheld), $(date -u +%FT%TZ)"
print_machine
resume=()
if [[ -n ${RESUME:-} ]]; then
  # `bench --resume` refuses a file measured in another environment or on another card, and a bare machine may
  # be another card each call: asked first by the bench's own test, a refused file leaves this call's shapes a
  # file of their own rather than none.
  if refused=$(python3 -c 'import sys
from mamba2_guard.adapters import fingerprint
from mamba2_guard.bench.timing import measured_under
from mamba2_guard.core.results import kept_on_resume
from mamba2_guard.flows.baselines import read_result
kept_on_resume(read_result(sys.argv[1]), measured_under(fingerprint.collect().to_dict()), {}, ())' "$RESUME" 2>&1)
  then
    cp "$RESUME" "$out/curve.json" && resume=(--resume)
  else
    echo "RESUME: $RESUME cannot be continued here (${refused##*$'\n'}); benching into a file of its own"
  fi
fi
# shellcheck disable=SC2086  # $shapes is a list of names
timeout $(( limit / 3 )) python3 -m mamba2_guard dev warm --shapes $shapes --processes "$(nproc)" > "$out/warm.json"
echo "warm exit $? after $SECONDS s"
# shellcheck disable=SC2086
timeout $(( limit - SECONDS - 20 )) python3 -m mamba2_guard bench --shapes $shapes --kernels ssd_combined_fwd_bwd \
  --rounds 10 --state-dir .gpu/state --json "$out/curve.json" "${resume[@]}"
echo "bench exit $? after $SECONDS s"
save_mamba_ssm_picks "$out/mamba-ssm-autotune-picks.tgz"
