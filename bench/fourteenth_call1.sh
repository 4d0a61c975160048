#!/usr/bin/env bash
# Fourteenth session, call 1: the evaluator's and the search loop's GPU tests (the timer's kept
# control gap, the bitwise-first nondeterminism check, the jump and the memory in a live run), then
# the loop throughput at 1 ms on the two bracketing tasks.
#   PYTHONPATH=. bash bench/fourteenth_call1.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 330 python3 -m pytest -q -m gpu tests/gpu/test_evaluator_gpu.py tests/gpu/test_search_gpu.py \
    -p no:cacheprovider -s -rf > "$OUT/gpu-tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu-tests.log" | tail -8
timeout $((585 - SECONDS)) python3 bench/throughput.py --out "$OUT/tp" \
    bench/tasks/act_mish_1ms.py:random:120 bench/tasks/pw_trig_chain_1ms.py:random:120
cd "$OUT/tp" 2>/dev/null && tar czf ../tp.tar.gz *.cuagent *.log throughput.md 2>/dev/null; cd - >/dev/null; rm -rf "$OUT/tp"
