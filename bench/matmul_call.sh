#!/usr/bin/env bash
# The matmul family's first device call (written in the twentieth session, which had no device):
# its GPU tests, then a short random search on example products with the final table (best time,
# speedup over eager and torch.compile, fraction of the floor). About 8 minutes on an H100/H200.
#   OUT=DIR PYTHONPATH=. bash bench/matmul_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } | tee "$OUT/gpu.txt"
timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_codegen_matmul_gpu.py -p no:cacheprovider -p no:logging -rf \
    > "$OUT/gpu-tests.log" 2>&1
echo "matmul gpu tests: exit $? ($(tail -1 "$OUT/gpu-tests.log"))"
for task in mm_square mm_bf16_rect fused_linear_gelu_scale mm_tall_skinny; do
    timeout 75 python3 -m core.cli run "resources/tasks/$task.py" --policy random --budget 12 --seed 0 \
        --project "$OUT/$task.cuagent" 2>&1 | tail -12
done
rm -f "$OUT"/*.cuagent-wal "$OUT"/*.cuagent-shm
