#!/usr/bin/env bash
# One device call (2026-12-06, twenty-seventh session): the runner's float32 fingerprint sums and
# one-read unwritten count against the code before them, on one GPU: the protocol's passes
# (bench/protocol_costs.py), then the loop's throughput on act_mish_1ms after and before (the
# before copy is this tree with bench/ab_before/{compare,runner}.py put back), then the GPU tests
# of the comparisons and the evaluator.
#   OUT=DIR PYTHONPATH=. bash bench/protocol_ab_call.sh
# AB_RUN overrides the throughput run (TASK:POLICY:BUDGET); AB_TESTS the tests ("" skips them).
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-./protocol-ab-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$out/gpu.txt"
run=${AB_RUN:-bench/tasks/act_mish_1ms.py:random:120}
python3 bench/protocol_costs.py bench/tasks/act_mish_1ms.py 2>&1 | grep -v Warning > "$out/protocol_costs.md"
grep -E "fingerprint|sums|unwritten" "$out/protocol_costs.md"
python3 bench/handover_cost.py 2>&1 | grep -v Warning | tee "$out/handover.md"
before=$(mktemp -d)/repo
mkdir -p "$before"
tar --exclude=./docs --exclude=./.git -cf - . | tar -xf - -C "$before"
cp bench/ab_before/compare.py bench/ab_before/runner.py "$before/core/evaluation/"
ab_round() {
    python3 bench/throughput.py --out "$out/after$1" "$run" > /dev/null 2>&1
    echo "after, round $1:"; grep -E "^\|" "$out/after$1/throughput.md" | tail -1
    (cd "$before" && PYTHONPATH=. python3 bench/throughput.py --out "$out/before$1" "$run" > /dev/null 2>&1)
    echo "before, round $1:"; grep -E "^\|" "$out/before$1/throughput.md" | tail -1
}
ab_round 1
tests=${AB_TESTS-tests/gpu/test_compare_gpu.py tests/gpu/test_evaluator_gpu.py}
if [ -n "$tests" ]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider $tests > "$out/gpu-tests.log" 2>&1
    echo "gpu tests ($tests): exit $?"; tail -3 "$out/gpu-tests.log"
fi
if [ "$SECONDS" -lt 400 ]; then ab_round 2; fi
# Few files come back from a call: the runs' tables and logs go in one archive.
rm -f "$out"/*/*.cuagent-wal "$out"/*/*.cuagent-shm "$out"/*/*.cuagent
(cd "$out" && tar czf runs.tar.gz after* before* && rm -rf after* before*)
