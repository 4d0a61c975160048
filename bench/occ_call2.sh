#!/usr/bin/env bash
# Call 3 of 2026-12-06: the matmul GPU test that failed when four shards shared the GPU, alone, and the
# example products at their default (OCC=1 now for 8 x 8 thread tiles); then those products' defaults
# against eager and torch.compile.
#   OUT=DIR PYTHONPATH=. bash bench/occ_call2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_codegen_matmul_gpu.py -k "mm_transposed_b_relu or example_product" \
    -p no:cacheprovider -p no:logging -rf > "$OUT/tests.log" 2>&1
echo "matmul gpu tests: exit $? ($(tail -1 "$OUT/tests.log"))"
grep -E "^E |^FAILED" "$OUT/tests.log" | cut -c1-400 | head -30
timeout 300 python3 bench/mma_speed.py --out "$OUT" --variants 0 --sampled 0 --deadline 260 \
    --tasks conv_2d conv_1d fused_linear_gelu_scale mm_batched mm_transposed_b fused_matmul_bias_residual_relu mm_odd_shapes \
    2>&1 | grep -v "^DEBUG" | grep -v "warn" | tail -40
rm -rf "$OUT/projects"
