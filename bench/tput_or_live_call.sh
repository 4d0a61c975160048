#!/usr/bin/env bash
# One device call, by card: on an H200 the 1 ms loop twice (act_mish_1ms, random, 60, cold compile caches) and
# live held-out runs of TASKS (bench/live_seeds_call.sh); on an H100 the evaluator GPU tests and the 1 ms loop
# three times. Each loop is broken down by bench/eval_breakdown.py.  OUT=DIR [TASKS="..."] [LOOPS=2] [LIVE_DEADLINE=480] bash bench/tput_or_live_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=.; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
loop() { for r in $(seq 1 $1); do CUDA_AGENT_CACHE=$OUT/cache timeout 200 python3 bench/throughput.py --fresh-compile-cache --out $OUT/tput-r$r bench/tasks/act_mish_1ms.py:random:60 > $OUT/tput-r$r.log 2>&1; echo "tput $r: $?"; grep -A3 "^| task" $OUT/tput-r$r/throughput.md | tail -1; rm -rf $OUT/tput-r$r/.driver-cache; done; rm -f $OUT/tput-r*/*.cuagent-wal $OUT/tput-r*/*.cuagent-shm; python3 bench/eval_breakdown.py $OUT/tput-r*/*.cuagent > $OUT/breakdown.md 2>&1; grep "^| all\|Median\|Memory" $OUT/breakdown.md; }
if grep -q H200 $OUT/gpu.txt; then
  [ "${LOOPS:-2}" -gt 0 ] && loop "${LOOPS:-2}"
  OUT=$OUT/live6 TASKS="${TASKS:-act_gelu_tanh_bf16 act_mish fused_bias_gelu_scale_fp16 loss_smooth_l1 norm_groupnorm norm_rmsnorm_bf16}" DEADLINE=$(( ${LIVE_DEADLINE:-480} - SECONDS )) bash bench/live_seeds_call.sh
else
  python3 -m pytest -q -m gpu tests/gpu/test_evaluator_gpu.py -p no:cacheprovider > $OUT/gpu-tests.log 2>&1; echo "gpu tests: $? ($(tail -1 $OUT/gpu-tests.log))"
  loop 3
fi
rm -rf $OUT/cache/compile*
