#!/usr/bin/env bash
# The example tasks with matrix products and convolutions through tests/gpu/test_codegen_gpu.py (default
# and four sampled schedules each) in SHARDS pytest processes sharing the GPU, then any that failed again
# alone (a shared GPU disturbs timing: one matmul case failed that way on 2026-12-06 and passed alone);
# then an optional sweep of sampled schedules (SWEEP_TASKS) against eager and torch.compile.
#   OUT=DIR [SHARDS=3] [TEST_TIMEOUT=S] [SWEEP_TASKS="TASK ..."] PYTHONPATH=. bash bench/product_tests_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
work=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pytest --co -q -m gpu tests/gpu/test_codegen_gpu.py -p no:cacheprovider \
    -k "mm_ or conv or fused_linear or fused_matmul or swiglu" | grep "::" | grep -v mm_matvec > "$work/ids"
echo "$(wc -l < "$work/ids") tests in ${SHARDS:-3} shards"
split -n "r/${SHARDS:-3}" "$work/ids" "$work/shard."
for f in "$work"/shard.??; do
    timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -m gpu $(cat "$f") -p no:cacheprovider -p no:logging -rf > "$f.log" 2>&1 &
done
wait
cat "$work"/shard.??.log > "$OUT/shards.log"
for f in "$work"/shard.??; do echo "$(basename "$f"): $(tail -1 "$f.log")"; done
failed=$(grep -h "^FAILED" "$work"/shard.??.log | sed 's/^FAILED \([^ ]*\).*/\1/')
grep -h "^E " "$work"/shard.??.log | cut -c1-300 | head -10
if [ -n "$failed" ]; then
    echo "again alone: $failed"
    timeout 200 python3 -m pytest -q -m gpu $failed -p no:cacheprovider -p no:logging -rf > "$OUT/alone.log" 2>&1
    echo "alone: exit $? ($(tail -1 "$OUT/alone.log"))"
    grep -E "^E " "$OUT/alone.log" | cut -c1-300 | head -10
fi
if [ -n "${SWEEP_TASKS:-}" ]; then
    timeout 200 python3 bench/mma_speed.py --out "$OUT" --variants 0 --sampled "${SWEEP_SAMPLED:-10}" --deadline 160 \
        --tasks $SWEEP_TASKS 2>&1 | grep -v "^DEBUG" | grep -v "warn" | tail -30
    rm -rf "$OUT/projects"
fi
