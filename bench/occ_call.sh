#!/usr/bin/env bash
# One device call: the matmul family's GPU tests in SHARDS parallel pytest processes (each its own
# evaluator on the one GPU, to fit the call: a failure there may be the sharing's, since the others'
# kernels count as stray time, so run it again alone), then the products' OCC variants (registers
# held to two blocks an SM) against eager and torch.compile, one task at a time. On 2026-12-06 the
# shards also measured the GPU's ceilings together (each about half; the floors of that call are off).
#   OUT=DIR [SHARDS=4] [OCC_TASKS="TASK ..."] [OCC_DEADLINE=S] [TEST_TIMEOUT=S] PYTHONPATH=. bash bench/occ_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; git rev-parse --short HEAD; } | tee "$OUT/gpu.txt"
if [ "${SHARDS:-4}" -gt 0 ]; then
    # The lists and logs stay out of OUT (a call brings back only a few files): one log comes back.
    work=$(mktemp -d)
    python3 -m pytest --co -q -m gpu tests/gpu/test_codegen_matmul_gpu.py -p no:cacheprovider | grep "::" > "$work/ids"
    split -n "r/${SHARDS:-4}" "$work/ids" "$work/shard."
    for f in "$work"/shard.??; do
        timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -m gpu $(cat "$f") -p no:cacheprovider -p no:logging -rf \
            > "$f.log" 2>&1 &
    done
    wait
    cat "$work"/shard.??.log > "$OUT/shards.log"
    for f in "$work"/shard.??; do echo "$(basename "$f"): $(tail -1 "$f.log")"; done
    grep -h -E "^FAILED|^E " "$work"/shard.??.log | cut -c1-300 | head -20
fi
timeout "$(( ${OCC_DEADLINE:-220} + 40 ))" python3 bench/mma_speed.py --out "$OUT" --occ --deadline "${OCC_DEADLINE:-220}" \
    --tasks ${OCC_TASKS:-conv_2d conv_1d fused_conv_bn_relu mm_square conv_3d} 2>&1 | grep -v "^DEBUG" | grep -v "warn" | tail -40
rm -rf "$OUT/projects"
