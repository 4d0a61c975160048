#!/usr/bin/env bash
# One device call for the SIMT kernel's vector fragment reads (SVEC): the matmul family's GPU tests
# (selected with SVEC_TESTS, a pytest -k expression), then the fp32 products' and convolutions'
# schedules (SVEC=1 against SVEC=4, tiles and slices) against eager and torch.compile.
#   OUT=DIR [SVEC_TESTS=EXPR] [SVEC_TASKS="TASK ..."] [SVEC_VARIANTS=N] [SVEC_NCU="SPEC ..."] PYTHONPATH=. bash bench/svec_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } | tee "$OUT/gpu.txt"
if [ -n "${SVEC_TESTS:-}" ]; then
    timeout "${SVEC_TEST_TIMEOUT:-200}" python3 -m pytest -q -m gpu tests/gpu/test_codegen_matmul_gpu.py -k "$SVEC_TESTS" \
        -p no:cacheprovider -p no:logging -rf --durations=5 > "$OUT/svec-tests.log" 2>&1
    echo "matmul gpu tests (-k $SVEC_TESTS): exit $? ($(tail -1 "$OUT/svec-tests.log"))"
    grep -E "^FAILED|Error|mismatch" "$OUT/svec-tests.log" | head -20
fi
timeout "$(( ${SVEC_DEADLINE:-300} + 40 ))" python3 bench/mma_speed.py --out "$OUT" --deadline "${SVEC_DEADLINE:-300}" ${SVEC_VARIANTS:+--variants $SVEC_VARIANTS} \
    --tasks ${SVEC_TASKS:-mm_square conv_2d fused_linear_gelu_scale conv_transpose2d} 2>&1 | grep -v "^DEBUG" | tail -70
rm -rf "$OUT/projects"
if [ -n "${SVEC_NCU:-}" ]; then
    timeout 180 python3 bench/ncu_table.py $SVEC_NCU 2>&1 | tee "$OUT/ncu.md" | tail -8
fi
