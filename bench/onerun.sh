#!/usr/bin/env bash
# One run of every generated task on one machine, in three calls (SHARD_BASE=0, 1, 2): each task's
# default, its known best and one random schedule (bench/gpu_session.sh all, EVALS=3). The first
# call also runs the codegen GPU tests of the split-reduction tasks and a 200-evaluation sweep of
# red_mean_dim0 (its table row in docs/performance.md comes from that sweep).
#   PYTHONPATH=. SHARD_BASE=0 bash bench/onerun.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
known=${KNOWN:-docs/results/best-schedules-2026-12-04.json}
if [ "${SHARD_BASE:-0}" = 0 ]; then
    export BEFORE="python3 -m pytest -q -m gpu tests/gpu/test_codegen_gpu.py -p no:cacheprovider \
-k 'red_mean_dim0 or red_argmax_dim1 or loss_mse or loss_smooth_l1 or norm_batchnorm2d_train' 2>&1 | tail -3; \
python3 bench/sweep.py --evals 200 --tasks red_mean_dim0 --known $known --timed-ms 25 --deadline 400 \
--out \$BEFORE_OUT/sweep200 2>&1 | tail -8"
fi
KNOWN=$known EVALS=3 SHARD_TOTAL=3 DEADLINE=${DEADLINE:-530} bash bench/gpu_session.sh all
tail -30 "$OUT/before.log" 2>/dev/null
for f in "$OUT"/sweep-shard*.log; do grep -E '^\| ' "$f"; done
