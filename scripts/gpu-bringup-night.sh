#!/usr/bin/env bash
# One "night" of a bring-up measured from zero on a GPU that has configs of its own (issue 50's measurement):
# the bring-up runs with the GPU's file withheld (`bring-up --withhold-configs`), between two benches of the
# whole SSD call against mamba-ssm with the same withheld file, which give two points of the anytime curve.
# WITHHOLD=0 runs the GPU's own bring-up on its own file instead, as its nightly would: what a GPU whose file
# lacks configs of kernels added since (the fused ones) does, and the file it ends with.
# Made for a device machine that starts bare on every call: the state of earlier nights comes in as a tarball
# and the new state goes out as one, so calls of at most 10 minutes resume each other as nights do.
#
#   scripts/gpu-bringup-night.sh OUTDIR [SECONDS] [STATE_TGZ]
#
# SECONDS: this call's wall-clock limit (default 570); the bring-up gets what the benches and the set-up leave.
# STATE_TGZ: an earlier night's OUTDIR/state.tgz (default: none, a bring-up from zero).
# SHAPES: the shapes benched before and after (default: the suite's). BENCH_AT: which of the two benches run
# (default "before after"; a call that only resumes the bring-up can skip one or both and leave the time to it).
# BENCH_SECONDS: each bench's limit (default 240: on a bare machine the first bench compiles every config it
# selects and mamba-ssm's autotune candidates, which took over 170 s for two shapes on an H100). SPEEDUPS:
# bench results (a curve point's curve.json files) whose calls below mamba-ssm's speed the bring-up searches
# first, as the nightly does with its own bench (`bring-up --speedups`); without it, this call's bench before,
# where it ran. Needs PYTHONPATH with the guard's wheels.
set -uo pipefail
# shellcheck source=scripts/gpu-machine.sh
source "${BASH_SOURCE[0]%/*}/gpu-machine.sh"
out=${1:?usage: gpu-bringup-night.sh OUTDIR [SECONDS] [STATE_TGZ]}
limit=${2:-570}
restore=${3:-}
shapes=${SHAPES:-nemotron3-nano long-context mamba2-default}
bench_limit=${BENCH_SECONDS:-240}
bench_at=${BENCH_AT-before after}
mkdir -p "$out" .gpu/state
exec > >(tee -a "$out/night.log") 2>&1
if [[ -n "$restore" ]]; then tar xzf "$restore" || exit 2; fi
restore_mamba_ssm_picks
night=$(( $(cat .gpu/state/nights 2>/dev/null || echo 0) + 1 ))
echo "$night" > .gpu/state/nights
slug=$(gpu_slug) || exit 2
file=$slug withhold=()
if [[ ${WITHHOLD:-1} != 0 ]]; then
  file=$slug-withheld withhold=(--withhold-configs)
  export MAMBA2_GUARD_GPU_SLUG=$file MAMBA2_GUARD_BORROW=0
fi
echo "night $night on $slug, $(date -u +%FT%TZ)"
print_machine

bench() {  # one point of the curve: the whole call at $shapes, $1 (before|after) this call's bring-up
  [[ " $bench_at " == *" $1 "* ]] || return 0
  # shellcheck disable=SC2086  # $shapes is a list of names
  timeout "$bench_limit" python3 -m mamba2_guard bench --shapes $shapes --kernels ssd_combined_fwd_bwd \
    --rounds 10 --state-dir .gpu/state --json "$out/curve-$night-$1.json"
}
bench before
before=$out/curve-$night-before.json
# Without SPEEDUPS, the bench before orders the searches; one cut short keeps the cases it measured, and one
# with none would make `bring-up --speedups` refuse to run.
if [[ -z ${SPEEDUPS:-} && -s $before ]] && python3 -c 'import sys
from mamba2_guard.commands.bring_up import measured_speedups
measured_speedups(sys.argv[1:])' "$before" 2>/dev/null; then SPEEDUPS=$before; fi
left=$(( limit - SECONDS - 20 ))
[[ " $bench_at " == *" after "* ]] && left=$(( left - bench_limit ))
echo "bring-up: $left s of this call left for it"
if (( left > 120 )); then
  speedups=()
  # shellcheck disable=SC2206  # $SPEEDUPS is a list of paths
  [[ -n ${SPEEDUPS:-} ]] && speedups=(--speedups $SPEEDUPS)
  # The flow starts no job past its budget, but the launch in flight and the run's close (the provisional
  # rule's fit, the state's record) end after it: a minute's margin before the kill, which would lose them.
  minutes=$(awk -v s="$left" 'BEGIN { printf "%.2f", (s - 60) / 60 }')
  timeout "$left" python3 -m mamba2_guard bring-up "${withhold[@]}" "${speedups[@]}" \
    --budget-minutes "$minutes" --state-dir .gpu/state --json | tee "$out/bringup-$night.txt"
  echo "bring-up exit ${PIPESTATUS[0]}"
fi
bench after
save_mamba_ssm_picks "$MAMBA_SSM_PICKS"
tar czf "$out/state.tgz" .gpu/state "mamba2_kernels/configs/$file.yaml" 2>/dev/null \
  || tar czf "$out/state.tgz" .gpu/state
echo "night $night done after $SECONDS s"
