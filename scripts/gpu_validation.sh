#!/usr/bin/env bash
# Everything the GPU machine must confirm (about 7 minutes on one H200; the device tool allows
# 10 minutes a call, so run the three steps as separate calls if one runs long):
#   1. the evaluator's GPU tests (good programs, ModelNew, the hostile corpus),
#   2. the export GPU tests (.cu built with torch.utils.cpp_extension, ModelNew KernelBench check),
#   3. the foundation figures (bench/foundation.py) written to $OUT/foundation.{json,md}.
# Run from the repository root:  PYTHONPATH=. bash scripts/gpu_validation.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-./gpu-validation}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
timeout 330 python3 -m pytest tests/gpu/test_evaluator_gpu.py -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -5
timeout 240 python3 -m pytest tests/gpu/test_export_gpu.py -q -s -p no:cacheprovider 2>&1 | tee "$OUT/export_tests.log" | tail -25
timeout 330 python3 bench/foundation.py --repeats 5 --out "$OUT" > "$OUT/bench.log" 2>&1
tail -40 "$OUT/foundation.md"
