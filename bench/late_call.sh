#!/usr/bin/env bash
# One device call (2026-12-07, thirty-second session): the thirty-first session's CPU-checked operators
# on a GPU, the exported .cu's shared-memory opt-in, and the search loop's GPU test with the memory start
# (each step under its own timeout):
#  1. bench/codegen_direct_gpu.py on the LATE_GPU cases against ATen's CUDA kernels (DIRECT_S, 150);
#  2. tests/gpu/test_export_gpu.py and tests/gpu/test_search_gpu.py (TESTS_S, 200);
#  3. some LATE_GPU cases through the evaluator itself (EVAL_K, EVAL_S, 200).
#   OUT=DIR PYTHONPATH=. bash bench/late_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-./late-call-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
echo "-- direct check"
timeout ${DIRECT_S:-150} python3 -W ignore bench/codegen_direct_gpu.py -k late_ --sampled 2 > "$out/direct.log" 2>&1
echo "direct: exit $? ($SECONDS s)"; grep -v -e "^ok" -e "Warning" -e "run = Launcher" -e "return F\." "$out/direct.log" | head -40
echo "-- export and search GPU tests"
timeout ${TESTS_S:-200} python3 -m pytest -v -m gpu -p no:cacheprovider -p no:logging --tb=line \
    tests/gpu/test_export_gpu.py tests/gpu/test_search_gpu.py > "$out/tests.log" 2>&1
echo "tests: exit $? ($SECONDS s)"; grep -o -e "::[a-z_0-9]*\(\[.*\]\)\? [A-Z]*" -e "^E .*" -e "[0-9]* passed.*" -e "[0-9]* failed.*" "$out/tests.log" | head -40
echo "-- through the evaluator"
timeout ${EVAL_S:-200} python3 -m pytest -v -m gpu -p no:cacheprovider -p no:logging --tb=line tests/gpu/test_codegen_cases_gpu.py \
    -k "${EVAL_K:-late_pdist or late_bilinear_layer or late_zeta or late_mask_put_accumulate}" > "$out/eval.log" 2>&1
echo "eval: exit $? ($SECONDS s)"; grep -o -e "\[late_.*\] [A-Z]*" -e "^E .*" -e "[0-9]* passed.*" -e "[0-9]* failed.*" "$out/eval.log" | head -40
exit 0
