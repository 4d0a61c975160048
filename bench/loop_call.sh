#!/usr/bin/env bash
# One device call (thirty-fifth session): the 1 ms loop with this tree, on whatever GPU came (issue 4
# asks for an H200): act_mish_1ms (1 ms on an H100, 3.5 GiB moved), random search, N candidates, cold
# compile cache, REPEAT runs in turn; the phase breakdown of every run; then, with PROFILE=1, one more
# run under cProfile with the evaluator's processes profiled (bench/profile_run.sh: where the host's
# time goes inside each phase); then the GPU tests in TESTS, if any.
#   OUT=DIR [N=60] [REPEAT=2] [TPUT_S=300] [PROFILE=1] [TESTS="tests/gpu/..."] PYTHONPATH=. bash bench/loop_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader; echo "cpus $(nproc)"; git log --oneline -1; } | tee "$OUT/gpu.txt"
timeout "${TPUT_S:-300}" python3 bench/throughput.py --fresh-compile-cache --repeat "${REPEAT:-2}" --out "$OUT/tput" \
    "bench/tasks/act_mish_1ms.py:random:${N:-60}" > "$OUT/tput.log" 2>&1
echo "throughput: exit $?"; grep -E '^\|' "$OUT/tput/throughput.md"
if [ "${PROFILE:-0}" = 1 ]; then
    OUT="$OUT/prof" timeout 200 bash bench/profile_run.sh bench/tasks/act_mish_1ms.py random "${N:-60}" mish
    for f in "$OUT"/prof/mish/project.cuagent*; do mv "$f" "$OUT/tput/profiled${f##*/project}"; done
    rm -f "$OUT"/prof/mish/*.prof
fi
rm -f "$OUT"/tput/*.cuagent-wal "$OUT"/tput/*.cuagent-shm
python3 bench/eval_breakdown.py "$OUT"/tput/*.cuagent > "$OUT/breakdown.md" 2>&1
grep -E '^\| all|^###|^Memory' "$OUT/breakdown.md"
(cd "$OUT" && tar czf projects.tar.gz tput/*.cuagent && rm -f tput/*.cuagent)
if [ -n "${TESTS:-}" ]; then
    # shellcheck disable=SC2086
    timeout "${TESTS_S:-200}" python3 -m pytest -q -m gpu -p no:cacheprovider $TESTS > "$OUT/gpu-tests.log" 2>&1
    echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu-tests.log"))"
fi
