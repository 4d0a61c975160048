#!/usr/bin/env bash
# One device call (2026-12-06, twenty-seventh session): the evaluation protocol's cheaper passes
# against the code before them, on one GPU. First the IPC hand-over of one output, part by part
# (bench/handover_cost.py); then the loop's throughput on act_mish_1ms in three trees, in turn:
#   after:   this tree (float32 fingerprint sums, one-read unwritten count, the judge reads the
#            runner's blocks in place);
#   copying: this tree with bench/ab_before/{judge,channel}.py put back (the judge copies each output);
#   before:  this tree with bench/ab_before/{compare,runner,judge,channel}.py put back;
# then the GPU tests of the comparisons and the evaluator; then, with time left, the protocol's
# passes one by one (bench/protocol_costs.py).
#   OUT=DIR PYTHONPATH=. bash bench/protocol_ab_call.sh
# bench/ab_before holds the four files as of AB_BEFORE_COMMIT (default 5716906, the code before these
# changes). Make it here before the call (the device's copy of .git may be stale), untracked:
#   for f in compare runner judge channel; do git show 5716906:core/evaluation/$f.py > bench/ab_before/$f.py; done
# AB_RUN overrides the throughput run (TASK:POLICY:BUDGET); AB_TREES the trees run (default
# "after copying before"); AB_TESTS the tests ("" skips them); AB_COSTS=0 skips the passes one by one;
# AB_HANDOVER=0 skips the hand-over costs.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-./protocol-ab-out}
mkdir -p "$out"; out=$(cd "$out" && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$out/gpu.txt"
run=${AB_RUN:-bench/tasks/act_mish_1ms.py:random:100}
[ "${AB_HANDOVER:-1}" = 1 ] && timeout 60 python3 bench/handover_cost.py 2>&1 | grep -v Warning | tee "$out/handover.md"
if [ ! -f bench/ab_before/channel.py ]; then
    mkdir -p bench/ab_before
    for f in compare runner judge channel; do
        git show "${AB_BEFORE_COMMIT:-5716906}:core/evaluation/$f.py" > "bench/ab_before/$f.py" || exit 2
    done
fi
tree() {    # tree NAME FILE... : a copy of this tree with those files of bench/ab_before put back
    local dir
    dir=$(mktemp -d)/$1
    mkdir -p "$dir"
    tar --exclude=./docs --exclude=./.git -cf - . | tar -xf - -C "$dir"
    shift
    for f in "$@"; do cp "bench/ab_before/$f.py" "$dir/core/evaluation/"; done
    echo "$dir"
}
throughput() {   # throughput NAME DIR
    (cd "$2" && PYTHONPATH=. timeout 200 python3 bench/throughput.py --out "$out/$1" "$run" > /dev/null 2>&1)
    echo "$1: $(grep -E '^\|' "$out/$1/throughput.md" | tail -1)"
}
for name in ${AB_TREES:-after copying before}; do
    case $name in
        after) throughput after "$PWD" ;;
        copying) throughput copying "$(tree copying judge channel)" ;;
        before) throughput before "$(tree before compare runner judge channel)" ;;
    esac
done
tests=${AB_TESTS-tests/gpu/test_compare_gpu.py tests/gpu/test_evaluator_gpu.py}
if [ -n "$tests" ]; then
    timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider $tests > "$out/gpu-tests.log" 2>&1
    echo "gpu tests ($tests): exit $?"; tail -3 "$out/gpu-tests.log"
fi
if [ "${AB_COSTS:-1}" = 1 ] && [ "$SECONDS" -lt 470 ]; then
    timeout $((560 - SECONDS)) python3 bench/protocol_costs.py bench/tasks/act_mish_1ms.py 2>&1 | grep -v Warning > "$out/protocol_costs.md"
    grep -E "fingerprint|sums|unwritten" "$out/protocol_costs.md"
fi
# Few files come back from a call: the runs' tables, logs and projects go in one archive.
(cd "$out" && tar czf runs.tar.gz ${AB_TREES:-after copying before} && rm -rf ${AB_TREES:-after copying before})
