#!/usr/bin/env bash
# GPU tests in one device call, file by file (each under its own timeout, a log each), for code
# changed since they last ran on a GPU.
#   OUT=DIR PYTHONPATH=. bash bench/gpu_tests_call.sh [TEST_FILE ...]
# Default: the evaluator's files (comparisons, protocol, search loop, export).
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-./gpu-tests-out}
mkdir -p "$out"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/gpu/test_compare_gpu.py tests/gpu/test_evaluator_gpu.py
                                 tests/gpu/test_search_gpu.py tests/gpu/test_export_gpu.py)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
for f in "${files[@]}"; do
    left=$((580 - SECONDS))
    if [ "$left" -lt 40 ]; then echo "$f: not run (no time left)"; continue; fi
    log="$out/$(basename "$f" .py).log"
    timeout "$left" python3 -m pytest -q -m gpu -p no:cacheprovider "$f" > "$log" 2>&1
    echo "$f: exit $? ($SECONDS s): $(tail -1 "$log")"
done
