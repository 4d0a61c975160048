#!/usr/bin/env bash
# One device call (2026-12-06, twenty-eighth session), on an H200 if one is lent, in order of need
# (each step under its own timeout; CALL_S, default 480, is the whole call's budget; AB_N the
# candidates of each act_mish_1ms run, default 80; RUNNING_S the first step's timeout, default
# 250: about 50 s a cummax case on an H100; CASES_K its pytest -k, default "running"):
#  1. the cummax / cummin cases of tests/gpu/test_codegen_cases_gpu.py (new on 2026-12-06; the
#     upsampling cases of 2026-12-07 with CASES_K=upsample);
#  2. the loop on act_mish_1ms (1 ms, 3.5 GiB moved) with this tree and with the code before the
#     twenty-seventh session's protocol changes (bench/protocol_ab_call.sh, trees "after before");
#  3. the loop on pw_trig_chain9_1ms (compute-bound, nine rounds of a trig chain, sized to about 1 ms);
#  4. tests/gpu/test_reverify_large_gpu.py (ten output blocks mapped at once), never run on a GPU.
#   OUT=DIR PYTHONPATH=. bash bench/h200_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-./h200-call-out}
mkdir -p "$out"; out=$(cd "$out" && pwd)
budget=${CALL_S:-480}
left() { echo $((budget - SECONDS)); }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
echo "-- generator cases on the GPU: -k ${CASES_K:-running}"
timeout ${RUNNING_S:-250} python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_codegen_cases_gpu.py -k "${CASES_K:-running}" > "$out/running.log" 2>&1
echo "running: exit $? ($SECONDS s)"; tail -3 "$out/running.log"
echo "-- act_mish_1ms, after / before"
AB_RUN=bench/tasks/act_mish_1ms.py:random:${AB_N:-80} AB_TREES="after before" AB_TESTS="" AB_COSTS=0 AB_HANDOVER=0 OUT="$out/ab" \
    timeout $(( $(left) - 130 )) bash bench/protocol_ab_call.sh 2>&1 | grep -v "^|"
echo "-- compute-bound chain ($SECONDS s)"
timeout $(( $(left) > 120 ? 120 : $(left) )) python3 bench/throughput.py --out "$out/chains" \
    bench/tasks/pw_trig_chain9_1ms.py:random:100 > "$out/chains.log" 2>&1
echo "chains: exit $? ($SECONDS s)"; grep -E '^\|' "$out/chains/throughput.md" 2>/dev/null | tail -1
if [ "$(left)" -gt 40 ]; then
    timeout "$(left)" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_reverify_large_gpu.py > "$out/reverify.log" 2>&1
    echo "reverify: exit $? ($SECONDS s)"; tail -3 "$out/reverify.log"
fi
# Few files come back: projects and tables in archives.
(cd "$out" && [ -d chains ] && tar czf chains.tar.gz chains && rm -rf chains)
(cd "$out/ab" && ls -d after before 2>/dev/null | xargs -r tar czf runs-left.tar.gz && rm -rf after before)
exit 0
