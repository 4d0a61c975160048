#!/usr/bin/env bash
# The matmul and conv families' first device calls (written in the twentieth session, which had no
# device), each well inside the 10-minute limit:
#   OUT=DIR PYTHONPATH=. bash bench/matmul_call.sh tests   their GPU tests (23 small cases at 4 schedules
#                                                          each, 5 example tasks at their default)
#   OUT=DIR PYTHONPATH=. bash bench/matmul_call.sh runs    a short random search on five example tasks
#       with the final table (best time, speedup over eager and torch.compile, fraction of the floor)
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } | tee "$OUT/gpu.txt"
case "${1:-}" in
tests)
    timeout 540 python3 -m pytest -q -m gpu tests/gpu/test_codegen_matmul_gpu.py -p no:cacheprovider -p no:logging -rf \
        > "$OUT/gpu-tests.log" 2>&1
    echo "matmul/conv gpu tests: exit $? ($(tail -1 "$OUT/gpu-tests.log"))"
    grep -E "^FAILED|Error" "$OUT/gpu-tests.log" | head -20 ;;
runs)
    for task in mm_square mm_bf16_rect fused_linear_gelu_scale conv_2d fused_conv_relu_maxpool; do
        timeout 100 python3 -m core.cli run "resources/tasks/$task.py" --policy random --budget 12 --seed 0 \
            --project "$OUT/$task.cuagent" 2>&1 | tail -12
    done
    rm -f "$OUT"/*.cuagent-wal "$OUT"/*.cuagent-shm ;;
*)
    echo "usage: bash bench/matmul_call.sh tests|runs" >&2; exit 2 ;;
esac
