#!/usr/bin/env bash
# One device call of live held-out runs with seeds (bench/live_seeds.py), after optional GPU tests.
#   OUT=DIR TASKS="name ..." [POLICIES="ppo ppo-untrained random"] [SEEDS="1 2 3"] [BUDGET=30] [DEADLINE=520] [TESTS="tests/gpu/..."] \
#   PYTHONPATH=. bash bench/live_seeds_call.sh
# $OUT gets gpu.txt, gpu-tests.log, live.log and live.tar.gz (runs.tsv and every run's project).
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; echo "cpus $(nproc)"; } | tee "$OUT/gpu.txt"
if [ -n "${TESTS:-}" ]; then
    # shellcheck disable=SC2086
    python3 -m pytest -q -m gpu $TESTS -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1
    echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu-tests.log"))"
fi
# shellcheck disable=SC2086
python3 bench/live_seeds.py --out "$OUT/live" --tasks $TASKS --policies ${POLICIES:-ppo ppo-untrained random} --seeds ${SEEDS:-1 2 3} --budget "${BUDGET:-30}" \
    --deadline $(( ${DEADLINE:-520} - SECONDS )) 2>&1 | tee "$OUT/live.log" | grep -v "^  "
rm -f "$OUT"/live/*/*/*.cuagent-wal "$OUT"/live/*/*/*.cuagent-shm
cat "$OUT/live/runs.tsv"
cd "$OUT" && tar czf live.tar.gz live && rm -rf live
