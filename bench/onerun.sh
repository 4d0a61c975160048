#!/usr/bin/env bash
# One run of every generated task on one machine, in three calls (SHARD_BASE=0, 1, 2, each well
# inside the device's 10-minute limit): each task's default, its known best (KNOWN) and one random
# schedule (bench/gpu_session.sh all, EVALS=3). Optional, in the first call, before its shard:
#   GPU_TESTS='PYTEST -k EXPRESSION'  the codegen GPU tests it selects;
#   SWEEP='TASK ...'                  a 200-evaluation sweep of those tasks (their rows come from it).
#   PYTHONPATH=. SHARD_BASE=0 bash bench/onerun.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
known=${KNOWN:-docs/results/best-schedules-2026-12-04.json}
before=()
if [ "${SHARD_BASE:-0}" = 0 ] && [ -n "${GPU_TESTS:-}" ]; then
    before+=("python3 -m pytest -q -m gpu tests/gpu/test_codegen_gpu.py -p no:cacheprovider -k '$GPU_TESTS' 2>&1 | tail -3")
fi
if [ "${SHARD_BASE:-0}" = 0 ] && [ -n "${SWEEP:-}" ]; then
    before+=("python3 bench/sweep.py --evals 200 --tasks $SWEEP --known $known --timed-ms 25 --deadline 400 \
--out \$BEFORE_OUT/sweep200 2>&1 | tail -8")
fi
if [ "${#before[@]}" -gt 0 ]; then
    BEFORE=$(printf '%s; ' "${before[@]}")
    export BEFORE
fi
KNOWN=$known EVALS=3 SHARD_TOTAL=3 DEADLINE=${DEADLINE:-530} bash bench/gpu_session.sh all
tail -30 "$OUT/before.log" 2>/dev/null
for f in "$OUT"/sweep-shard*.log; do grep -E '^\| ' "$f"; done
