#!/usr/bin/env bash
# Twelfth session, call 3: the generators' synthetic and data-movement cases on the GPU
# (tests/gpu/test_codegen_cases_gpu.py), then the data-movement family's figures: bench/sweep.py of
# the bench/tasks/move_*.py tasks (eager, torch.compile, default, best of 30, floor).
#   PYTHONPATH=. bash bench/twelfth_call3.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 250 python3 -m pytest -q -m gpu tests/gpu/test_codegen_cases_gpu.py -p no:cacheprovider -rf > "$OUT/cases-gpu.log" 2>&1
tail -25 "$OUT/cases-gpu.log"
python3 bench/sweep.py --evals 30 --tasks bench/tasks/move_exclusive_cumsum.py bench/tasks/move_transpose.py \
    bench/tasks/move_pad_cat.py bench/tasks/move_glu_fp16.py bench/tasks/mm_diag_kernelbench.py --timed-ms 25 --deadline 170 --out "$OUT/move" \
    > "$OUT/move.log" 2>&1
grep -E '^\||Geomean|failures: [1-9]' "$OUT/move.log"
rm -rf "$OUT/move/projects"
