#!/usr/bin/env bash
# One device call for MMA=1's cp.async ring (STAGES > 0): its GPU tests, then the half-precision product
# tasks' schedules (register-staged, ring depths and tiles) against eager and torch.compile.
#   OUT=DIR PYTHONPATH=. bash bench/ring_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } | tee "$OUT/gpu.txt"
timeout "${RING_TEST_TIMEOUT:-170}" python3 -m pytest -q -m gpu tests/gpu/test_codegen_matmul_gpu.py -k "${RING_TESTS:-ring}" \
    -p no:cacheprovider -p no:logging -rf --durations=5 > "$OUT/ring-tests.log" 2>&1
echo "ring gpu tests (-k ${RING_TESTS:-ring}): exit $? ($(tail -1 "$OUT/ring-tests.log"))"
grep -E "^FAILED|Error|mismatch" "$OUT/ring-tests.log" | head -20
timeout 330 python3 bench/mma_speed.py --out "$OUT" --deadline "${RING_DEADLINE:-290}" \
    --tasks ${RING_TASKS:-mm_fp16 mm_bf16_rect fused_swiglu_bf16} 2>&1 | grep -v "^DEBUG" | tail -60
rm -rf "$OUT/projects"
if [ -n "${RING_NCU:-}" ]; then
    timeout 150 python3 bench/ncu_table.py $RING_NCU 2>&1 | tee "$OUT/ncu.md" | tail -8
fi
