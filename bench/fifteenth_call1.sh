#!/usr/bin/env bash
# The fifteenth session's first device call (about 7 minutes on one H200): loop throughput
# (issue 4: >= 300 candidates a minute at 0.1-1 ms) after compile-ahead learned to look further when
# compiles are slow, with more compile processes on large hosts and one kept for the loop's own
# compiles. First the compile-bound task as before (bench/fixed_depth_run.py: 6 predictions, 6
# processes, none kept), then the same task and the three earlier throughput tasks on today's
# defaults. Every run starts from an empty compile cache.
#   OUT=DIR PYTHONPATH=. bash bench/fifteenth_call1.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; echo "cpus $(nproc)"; } | tee "$OUT/gpu.txt"
timeout 150 python3 bench/throughput.py --out "$OUT/before" --fixed-depth --compile-workers 6 --fresh-compile-cache \
    bench/tasks/pw_trig_chain_1ms.py:random:150
timeout $((560 - SECONDS)) python3 bench/throughput.py --out "$OUT/after" --fresh-compile-cache \
    bench/tasks/pw_trig_chain_1ms.py:random:150 bench/tasks/act_mish_1ms.py:random:150 \
    softmax_dim1_fp16:random:200 loss_kl_div:ppo:250
rm -f "$OUT"/*/*.cuagent-wal "$OUT"/*/*.cuagent-shm
cat "$OUT"/before/throughput.md "$OUT"/after/throughput.md
cd "$OUT" && tar czf call1.tar.gz before after && rm -rf before after      # few files come back
