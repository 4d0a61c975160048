#!/usr/bin/env bash
# One device call (2026-12-07, thirty-first session): long-row kthvalue / median / nanmedian by radix
# select, long-row topk from per-thread candidates, the short-row topk LOCAL default, and the
# shared-memory opt-in that counts a kernel's static shared memory (each step under its own timeout):
#  1. bench/codegen_direct_gpu.py on the selection cases against ATen's CUDA kernels (DIRECT_S, 150);
#  2. bench/new_ops_speed.py on the topk / median / kthvalue / long sort cases (SPEED_S, 150);
#  3. the long-row cases through the evaluator itself (EVAL_K, EVAL_S, 200).
#   OUT=DIR PYTHONPATH=. bash bench/radix_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-./radix-call-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
echo "-- direct check"
timeout ${DIRECT_S:-150} python3 -W ignore bench/codegen_direct_gpu.py -k select --sampled 2 > "$out/direct.log" 2>&1
echo "direct: exit $? ($SECONDS s)"; grep -v -e "^ok" -e "Warning" -e "run = Launcher" -e "return F\." "$out/direct.log" | head -40
echo "-- speed"
timeout ${SPEED_S:-150} python3 -W ignore bench/new_ops_speed.py --reps 20 --sampled 3 -k topk -k median -k kthvalue \
    -k sort_rows_65536 > "$out/speed.md" 2>&1
echo "speed: exit $? ($SECONDS s)"; grep -e "^|" -e "^NVIDIA" "$out/speed.md"
echo "-- through the evaluator"
timeout ${EVAL_S:-200} python3 -m pytest -v -m gpu -p no:cacheprovider -p no:logging --tb=line tests/gpu/test_codegen_cases_gpu.py \
    -k "${EVAL_K:-kthvalue_long or median_whole or topk_long or nanmedian_long or median_long or median_double or nanmedian_whole}" > "$out/eval.log" 2>&1
echo "eval: exit $? ($SECONDS s)"; grep -o -e "\[select_.*\] [A-Z]*" -e "^E .*" -e "[0-9]* passed.*" -e "[0-9]* failed.*" "$out/eval.log" | head -40
exit 0
