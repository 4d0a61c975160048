#!/usr/bin/env bash
# One device call (2026-12-06, twenty-eighth session), on an H200 if one is lent:
#  1. the loop on act_mish_1ms (1 ms, 3.5 GiB moved) with this tree and with the code before the
#     twenty-seventh session's protocol changes (bench/protocol_ab_call.sh, trees "after before");
#  2. the loop on the two compute-bound chains, pw_trig_chain_1ms (three rounds) and
#     pw_trig_chain9_1ms (nine rounds, sized to about 1 ms), in this tree;
#  3. the cummax / cummin cases of tests/gpu/test_codegen_cases_gpu.py (new this session);
#  4. tests/gpu/test_reverify_large_gpu.py (ten output blocks mapped at once), never run on a GPU.
#   OUT=DIR PYTHONPATH=. bash bench/h200_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-./h200-call-out}
mkdir -p "$out"; out=$(cd "$out" && pwd)
AB_TREES="after before" AB_TESTS="" AB_COSTS=0 OUT="$out/ab" timeout 300 bash bench/protocol_ab_call.sh
echo "-- compute-bound chains ($SECONDS s)"
timeout 150 python3 bench/throughput.py --out "$out/chains" bench/tasks/pw_trig_chain9_1ms.py:random:120 \
    bench/tasks/pw_trig_chain_1ms.py:random:120 > "$out/chains.log" 2>&1
echo "chains: exit $?"; grep -E '^\|' "$out/chains/throughput.md"
echo "-- cummax / cummin on the GPU ($SECONDS s)"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_codegen_cases_gpu.py -k running > "$out/running.log" 2>&1
echo "running: exit $?"; tail -3 "$out/running.log"
echo "-- reverify test ($SECONDS s)"
left=$((585 - SECONDS))
if [ "$left" -gt 30 ]; then
    timeout "$left" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_reverify_large_gpu.py > "$out/reverify.log" 2>&1
    echo "reverify: exit $?"; tail -3 "$out/reverify.log"
fi
(cd "$out" && tar czf chains.tar.gz chains && rm -rf chains)
# A protocol_ab_call.sh cut short by its timeout leaves its runs unpacked.
(cd "$out/ab" && ls -d after before 2>/dev/null | xargs -r tar czf runs-left.tar.gz && rm -rf after before)
