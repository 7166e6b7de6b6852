#!/usr/bin/env bash
# One GPU call for the Helion SSD forward kernels: tune at the given shape (one process per kernel, so
# one failure or overrun cannot lose the others), then time against mamba-ssm. Everything goes to $OUT.
#   TUNE_SHAPE=nemotron3-nano TUNE_KERNELS="chunk_scan ..." TUNE_S=70 BUDGET=30 BENCH_S=150 \
#   BENCH_SHAPES="nemotron3-nano long-context mamba2-default" scripts/gpu_ssd_forward.sh
set -u
export PYTHONUNBUFFERED=1
CFG=kernels/configs/nvidia-h200.yaml
mkdir -p kernels/configs
[ -f "$CFG" ] && cp "$CFG" "$OUT/nvidia-h200.yaml"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
for k in ${TUNE_KERNELS:-}; do
  timeout "${TUNE_S:-70}" python3 scripts/autotune.py --kernels "$k" --shapes ${TUNE_SHAPE:-nemotron3-nano} \
    --effort quick --seed 1234 --budget-seconds "${BUDGET:-30}" --out "$OUT/nvidia-h200.yaml" \
    --log "$OUT/tune.jsonl" 2>&1 | grep -v "^\s*$" | tail -n 5
done
if [ -n "${PLAN:-}" ]; then
  timeout "${TUNE_TOTAL_S:-400}" python3 scripts/tune_ssd_forward.py --plan $PLAN --budget-seconds "${BUDGET:-25}" \
    --deadline-seconds "${DEADLINE_S:-330}" --out "$OUT/nvidia-h200.yaml" 2>&1 | grep -v "^\s*$" \
    | tee "$OUT/tune.log" | grep -E '^\{|FAILED|Error|deadline|done' | cut -c1-400
fi
if [ -n "${TUNE_SCAN:-}" ]; then
  MAMBA2_GUARD_STATE_PASSING_VARIANT=scan timeout "${TUNE_S:-70}" python3 scripts/autotune.py \
    --kernels state_passing --shapes ${TUNE_SHAPE:-nemotron3-nano} --effort quick --seed 1234 \
    --budget-seconds "${BUDGET:-30}" --out "$OUT/nvidia-h200.yaml" --log "$OUT/tune.jsonl" 2>&1 | tail -n 5
fi
[ -f "$OUT/nvidia-h200.yaml" ] && cp "$OUT/nvidia-h200.yaml" "$CFG"
if [ -n "${BENCH_SHAPES:-}" ]; then
  timeout "${BENCH_S:-150}" python3 scripts/bench_ssd_forward.py --shapes $BENCH_SHAPES --rounds 30 \
    --out "$OUT/bench.json" 2>&1 | grep -v "^\s*$" | tee "$OUT/bench.log" | cut -c1-600
fi
