#!/usr/bin/env bash
# One device call for the matmul family's tensor-core path (MMA=1): its GPU tests, then the speed of
# the product tasks' schedules against eager and torch.compile (bench/mma_speed.py).
#   OUT=DIR PYTHONPATH=. bash bench/mma_call.sh [tests]      (tests: the GPU tests only, at most 4 minutes;
#   MMA_TESTS=EXPR picks others with pytest -k)
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } | tee "$OUT/gpu.txt"
# The whole file takes about 7 minutes; by default the tensor-core tests and the transposed convolutions'.
timeout 230 python3 -m pytest -q -m gpu tests/gpu/test_codegen_matmul_gpu.py -k "${MMA_TESTS:-tensor_core or half_product or conv_transpose}" \
    -p no:cacheprovider -p no:logging -rf --durations=5 > "$OUT/mma-tests.log" 2>&1
echo "matmul/conv gpu tests (${MMA_TESTS:-tensor cores, transposed convolutions}): exit $? ($(tail -1 "$OUT/mma-tests.log"))"
grep -E "^FAILED|Error|mismatch" "$OUT/mma-tests.log" | head -20
[ "${1:-}" = tests ] && exit 0
timeout 300 python3 bench/mma_speed.py --out "$OUT" --deadline 230 ${MMA_TASKS:+--tasks $MMA_TASKS} 2>&1 | grep -v "^DEBUG" | tail -70
rm -rf "$OUT/projects"
