#!/usr/bin/env bash
# One device call for the search loop's GPU checks after the thirteenth session (no device then):
# the jump action and the memory in a live run (tests/gpu/test_search_gpu.py, which also checks that
# a GPU run is remembered), and the Timer's measure_stray change (tests/gpu/test_evaluator_gpu.py).
# Every log goes under $OUT; the summaries are printed at the end.
#   PYTHONPATH=. bash bench/search_gpu_checks.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_search_gpu.py -p no:cacheprovider -s -rf \
    > "$OUT/search-gpu.log" 2>&1
timeout 330 python3 -m pytest -q -m gpu tests/gpu/test_evaluator_gpu.py -p no:cacheprovider -rf \
    > "$OUT/evaluator-gpu.log" 2>&1
for log in "$OUT"/search-gpu.log "$OUT"/evaluator-gpu.log; do
    echo "== $log"
    grep -E "^(FAILED|ERROR)|passed|failed|act_gelu:|act_mish:|red_var_dim1:" "$log" | tail -12
done
