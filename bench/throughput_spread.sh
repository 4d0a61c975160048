#!/usr/bin/env bash
# One device call (about 9 minutes on one H200): the loop throughput's spread between runs of the same
# code and seed (seventeenth session: 246 and 373 a minute for one task, docs/performance.md).
# bench/throughput.py runs the compile-bound task with random search and loss_kl_div with PPO, in
# turn, three times each, every run from an empty compile cache; its table gives each run's NVRTC
# times (every compile of the run) and the load average before it. The host's CPU and load are logged
# beside, so a slow run can be put down to NVRTC, to the host, or to compile-ahead's misses.
#   OUT=DIR PYTHONPATH=. bash bench/throughput_spread.sh      ($OUT/gpu.txt, host.txt, spread.tar.gz)
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; echo "cpus $(nproc)"; } | tee "$OUT/gpu.txt"
{ lscpu | grep -E "Model name|^CPU\(s\)|MHz"; uptime; } > "$OUT/host.txt" 2>&1
python3 bench/throughput.py --out "$OUT/spread" --fresh-compile-cache --repeat 3 --deadline $(( ${DEADLINE:-430} - SECONDS )) \
    bench/tasks/pw_trig_chain_1ms.py:random:150 loss_kl_div:ppo:250 | grep "^|"
rm -rf "$OUT"/spread/.driver-cache; rm -f "$OUT"/spread/*.cuagent-wal "$OUT"/spread/*.cuagent-shm
cd "$OUT" && tar czf spread.tar.gz spread && rm -rf spread
