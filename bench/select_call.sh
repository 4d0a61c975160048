#!/usr/bin/env bash
# One device call (2026-12-07): what code generation took this session, on a GPU, against ATen's CUDA
# kernels (each step under its own timeout):
#  1. bench/codegen_direct_gpu.py on the upsampling, adaptive pool, selection and cummax / cummin cases of
#     tests/gpu/test_codegen_cases_gpu.py (default + 1 sampled schedule each; DIRECT_S, default 240);
#  2. bench/new_ops_speed.py: ours against eager, torch.compile and the memory floor (SPEED_S, 200);
#  3. a few of those cases through the evaluator itself (EVAL_K, EVAL_S, 140).
#   OUT=DIR PYTHONPATH=. bash bench/select_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-./select-call-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
echo "-- direct check"
timeout ${DIRECT_S:-240} python3 bench/codegen_direct_gpu.py -k select -k upsample -k adaptive -k rrelu -k grid -k spatial -k bucketize -k searchsorted -k int_floor -k running -k scatter --sampled 1 > "$out/direct.log" 2>&1
echo "direct: exit $? ($SECONDS s)"; grep -v "^ok" "$out/direct.log" | head -50
echo "-- speed"
timeout ${SPEED_S:-200} python3 bench/new_ops_speed.py --reps 20 --sampled 4 > "$out/speed.md" 2>&1
echo "speed: exit $? ($SECONDS s)"; cat "$out/speed.md" | head -40
echo "-- through the evaluator"
timeout ${EVAL_S:-140} python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_codegen_cases_gpu.py \
    -k "${EVAL_K:-select_topk_rows or select_sort_long_rows or scatter_index_add_rows or scatter_fold or select_sort_fp16_ties_long}" > "$out/eval.log" 2>&1
echo "eval: exit $? ($SECONDS s)"; tail -4 "$out/eval.log"
exit 0
