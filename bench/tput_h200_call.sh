#!/usr/bin/env bash
# One device call (thirty-fifth session): loop throughput at 1 ms memory-bound with this tree, on
# whatever GPU came (issue 4 asks for an H200): act_mish_1ms (1 ms on an H100, 3.5 GiB moved), random
# search, N candidates, cold compile cache, REPEAT runs in turn; then the phase breakdown of every run.
#   OUT=DIR [N=60] [REPEAT=2] PYTHONPATH=. bash bench/tput_h200_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader; echo "cpus $(nproc)"; git log --oneline -1; } | tee "$OUT/gpu.txt"
timeout "${TPUT_S:-300}" python3 bench/throughput.py --fresh-compile-cache --repeat "${REPEAT:-2}" --out "$OUT/tput" \
    "bench/tasks/act_mish_1ms.py:random:${N:-60}" > "$OUT/tput.log" 2>&1
echo "throughput: exit $?"; grep -E '^\|' "$OUT/tput/throughput.md"
rm -f "$OUT"/tput/*.cuagent-wal "$OUT"/tput/*.cuagent-shm
python3 bench/eval_breakdown.py "$OUT"/tput/*.cuagent > "$OUT/breakdown.md" 2>&1
grep -E '^\|' "$OUT/breakdown.md" | head -20
(cd "$OUT" && tar czf projects.tar.gz tput/*.cuagent && rm -f tput/*.cuagent)
