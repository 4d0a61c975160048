#!/usr/bin/env bash
# One device call that measures what the CPU-only sessions built, spread over the GPUs it finds.
#
#   PYTHONPATH=. bench/gpu_session.sh speed   # GPU tests of codegen + search, then bench/sweep.py --evals 20
#   PYTHONPATH=. bench/gpu_session.sh dense   # bench/sweep.py --record-all $MAX_SPACE (default 1000): every
#                                             # legal schedule of the smaller spaces (or of $TASKS), for `cuda-agent train`
#   PYTHONPATH=. bench/gpu_session.sh all     # bench/sweep.py --evals $EVALS on every generated task: the
#                                             # speed table and the training records in one pass
#
# Each GPU runs one shard (CUDA_VISIBLE_DEVICES=i, --shard SHARD_BASE+i/SHARD_TOTAL; by default the
# shards are the GPUs of this call; two calls on two GPUs cover four shards with SHARD_TOTAL=4 and
# SHARD_BASE=0, then 2). TESTS (codegen+search in speed mode, none otherwise; "search" runs only
# tests/gpu/test_search_gpu.py) run on GPU 0 before its shard. $OUT gets session.log, gpu-tests.log,
# one sweep log per shard and one shardI.tar.gz per shard (its sweep.json, sweep.md and projects).
# DEADLINE (seconds from this script's start, default 480) is what is left to each sweep: no task
# starts that would not end before it (by the cost of the tasks done so far), and a task still
# running at it stops and keeps what it measured, so the call ends inside the device's per-command limit.
# TIMED_MS (default 25, as the evaluator's; docs/performance.md) is each timing's
# timed wall time (bench/sweep.py --timed-ms).
# KNOWN (a JSON file of best schedules, e.g. docs/results/best-schedules-2026-12-02-eighth.json) is passed to
# bench/sweep.py --known: each task's known best is evaluated right after its default. One run of every
# task on one machine (about 20 s a task): KNOWN=... EVALS=3 SHARD_TOTAL=2 SHARD_BASE=0 bench/gpu_session.sh all,
# then SHARD_BASE=1 in the next call.
# BEFORE, a shell command, runs on GPU 0 after its tests and before its shard, with $BEFORE_OUT a
# folder that comes back as before.tar.gz (its output goes to before.log).
set -uo pipefail
mode=${1:-speed}
out=${OUT:-./gpu-session-out}
deadline=${DEADLINE:-480}
evals=${EVALS:-100}
mkdir -p "$out"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 1 ]; then
    echo "no GPU found (nvidia-smi -L lists none): nothing to measure" >&2
    exit 3
fi
shard_base=${SHARD_BASE:-0}
shard_total=${SHARD_TOTAL:-$gpus}
echo "$(date -u +%FT%TZ) mode=$mode gpus=$gpus deadline=$deadline shards=$shard_base..+$gpus/$shard_total" \
    | tee "$out/session.log"
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv | tee -a "$out/session.log"

tasks=()
case "$mode" in
    speed) args=(--evals 20); tests=${TESTS:-codegen+search} ;;
    all) args=(--evals "$evals"); tests=${TESTS:-none} ;;
    dense)
        # Training records: every legal schedule of each task whose space has at most MAX_SPACE
        # (default 1000) of them; larger spaces are skipped and listed in sweep.json.
        args=(--record-all "${MAX_SPACE:-1000}"); tests=${TESTS:-none} ;;
    *) echo "usage: bench/gpu_session.sh speed|dense|all" >&2; exit 2 ;;
esac
if [ -n "${TASKS:-}" ]; then read -ra tasks <<< "$TASKS"; fi   # e.g. what an earlier call's deadline left out
[ "${#tasks[@]}" -gt 0 ] && echo "tasks: ${#tasks[@]}: ${tasks[*]}" | tee -a "$out/session.log"

test_files=()
case "$tests" in
    codegen+search) test_files=(tests/gpu/test_codegen_gpu.py tests/gpu/test_search_gpu.py) ;;
    search) test_files=(tests/gpu/test_search_gpu.py) ;;
esac

run_shard() {   # GPU index i: (tests on GPU 0 first), then its sweep shard with what is left of the deadline
    local i=$1
    if [ "$i" -eq 0 ] && [ "${#test_files[@]}" -gt 0 ]; then
        # The tests must pass before the sweep's figures mean anything.
        CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -m gpu "${test_files[@]}" -p no:cacheprovider -s \
            > "$out/gpu-tests.log" 2>&1
        echo "gpu tests: exit $? ($(tail -1 "$out/gpu-tests.log"))" | tee -a "$out/session.log"
    fi
    if [ "$i" -eq 0 ] && [ -n "${BEFORE:-}" ]; then
        mkdir -p "$out/before"
        CUDA_VISIBLE_DEVICES=0 BEFORE_OUT="$out/before" bash -c "$BEFORE" > "$out/before.log" 2>&1
        echo "before: exit $? after ${SECONDS} s" | tee -a "$out/session.log"
    fi
    local left=$((deadline - SECONDS))
    local task_args=()
    if [ "${#tasks[@]}" -gt 0 ]; then task_args=(--tasks "${tasks[@]}"); fi
    if [ -n "${KNOWN:-}" ]; then task_args+=(--known "$KNOWN"); fi
    mkdir -p "$out/shard$i"
    CUDA_VISIBLE_DEVICES=$i python3 bench/sweep.py "${args[@]}" "${task_args[@]}" \
        --timed-ms "${TIMED_MS:-25}" --shard "$((shard_base + i))/$shard_total" --deadline "$left" --out "$out/shard$i" \
        > "$out/sweep-shard$i.log" 2>&1
}

pids=()
for ((i = 0; i < gpus; i++)); do
    run_shard "$i" &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
if [ -d "$out/before" ]; then tar -czf "$out/before.tar.gz" -C "$out" before && rm -rf "${out:?}/before"; fi
for ((i = 0; i < gpus; i++)); do
    # One archive per shard (sweep.json, sweep.md, the projects): the device returns at most 8 files.
    rm -f "$out/shard$i/sweep-projects.tar.gz"   # the projects go in whole, once
    tar -czf "$out/shard$i.tar.gz" -C "$out" "shard$i" && rm -rf "${out:?}/shard$i"
    echo "shard $i: $(grep -E "tasks to sweep|deadline:|Error" "$out/sweep-shard$i.log" | head -3 | tr "\n" " ")" | tee -a "$out/session.log"
done
