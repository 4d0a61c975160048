#!/usr/bin/env bash
# One device call for issue 4's loop-throughput figure (>= 300 candidates a minute at 0.1-1 ms):
# bench/throughput.py over four tasks, about 6 minutes on one H200. act_mish_1ms (1.1 ms, 3.5 GiB
# moved per call) and pw_trig_chain_1ms (compute-bound, 256 MiB moved) bracket the 1 ms end: the
# evaluation protocol's passes over inputs and outputs cost by the byte. softmax_dim1_fp16 (0.44 ms)
# and loss_kl_div (0.2 ms) are the earlier sessions' rows, for comparison on the same loan.
#   PYTHONPATH=. bash bench/throughput_call.sh        (tables and logs under $OUT/throughput)
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 560 python3 bench/throughput.py --out "$OUT/throughput" \
    bench/tasks/act_mish_1ms.py:random:150 bench/tasks/pw_trig_chain_1ms.py:random:150 \
    softmax_dim1_fp16:random:200 loss_kl_div:ppo:250
rm -f "$OUT"/throughput/*.cuagent-wal "$OUT"/throughput/*.cuagent-shm
