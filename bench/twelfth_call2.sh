#!/usr/bin/env bash
# Twelfth session, call 2: the generators' synthetic cases on the GPU (tests/gpu/test_codegen_cases_gpu.py),
# then where a 1 ms candidate's evaluation time goes (bench/profile_run.sh: act_mish_1ms, random, 40).
#   PYTHONPATH=. bash bench/twelfth_call2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_codegen_cases_gpu.py -p no:cacheprovider 2>&1 | tail -15
OUT="$OUT/prof" timeout 300 bash bench/profile_run.sh bench/tasks/act_mish_1ms.py random 40 mish
for f in "$OUT"/prof/mish/*.txt; do echo "== $f"; sed -n '/Ordered by: internal time/,$p' "$f" | head -40; done
