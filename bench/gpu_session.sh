#!/usr/bin/env bash
# One device call that measures what the CPU-only sessions built, spread over the GPUs it finds.
#
#   PYTHONPATH=. bench/gpu_session.sh speed   # GPU tests of codegen + search, then bench/sweep.py --evals 20
#   PYTHONPATH=. bench/gpu_session.sh dense   # bench/sweep.py --evals $EVALS (default 150) on one-group tasks
#                                             # (or on $TASKS): dense records for `cuda-agent train`
#
# Each GPU runs one shard (CUDA_VISIBLE_DEVICES=i, --shard i/N); $OUT gets session.log, gpu-tests.log,
# one sweep log per shard and one shardI.tar.gz per shard (its sweep.json, sweep.md and projects). DEADLINE (seconds, default 480) is passed to every sweep so
# the call ends inside the device's per-command limit with what it measured.
set -uo pipefail
mode=${1:-speed}
out=${OUT:-./gpu-session-out}
deadline=${DEADLINE:-480}
evals=${EVALS:-150}
mkdir -p "$out"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 1 ]; then
    echo "no GPU found (nvidia-smi -L lists none): nothing to measure" >&2
    exit 3
fi
echo "$(date -u +%FT%TZ) mode=$mode gpus=$gpus deadline=$deadline" | tee "$out/session.log"
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv | tee -a "$out/session.log"

if [ "$mode" = "speed" ]; then
    # The GPU tests on GPU 0 first (they must pass before the sweep's figures mean anything).
    CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -m gpu tests/gpu/test_codegen_gpu.py tests/gpu/test_search_gpu.py \
        -p no:cacheprovider -s > "$out/gpu-tests.log" 2>&1
    echo "gpu tests: exit $? ($(tail -1 "$out/gpu-tests.log"))" | tee -a "$out/session.log"
    tasks=()
    args=(--evals 20)
elif [ "$mode" = "dense" ]; then
    # One-group programs only: their spaces are small enough to record densely (a few hundred
    # schedules); multi-group products run to millions.
    mapfile -t tasks < <(python3 - <<'EOF'
from pathlib import Path
from core.codegen import CodegenError, generate
from core.tasks import load_task
for path in sorted(Path("resources/tasks").glob("*.py")):
    try:
        gen = generate(load_task(path))
    except (CodegenError, Exception):
        continue
    if len(gen.groups) <= 1:
        print(path.stem)
EOF
)
    if [ -n "${TASKS:-}" ]; then read -ra tasks <<< "$TASKS"; fi   # e.g. what an earlier call's deadline left out
    echo "dense: ${#tasks[@]} tasks: ${tasks[*]}" | tee -a "$out/session.log"
    args=(--evals "$evals")
else
    echo "usage: bench/gpu_session.sh speed|dense" >&2
    exit 2
fi

pids=()
for ((i = 0; i < gpus; i++)); do
    mkdir -p "$out/shard$i"
    task_args=()
    if [ "${#tasks[@]}" -gt 0 ]; then task_args=(--tasks "${tasks[@]}"); fi
    CUDA_VISIBLE_DEVICES=$i python3 bench/sweep.py "${args[@]}" "${task_args[@]}" --shard "$i/$gpus" \
        --deadline "$deadline" --out "$out/shard$i" > "$out/sweep-shard$i.log" 2>&1 &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
for ((i = 0; i < gpus; i++)); do
    # One archive per shard (sweep.json, sweep.md, the projects): the device returns at most 8 files.
    tar -czf "$out/shard$i.tar.gz" -C "$out" "shard$i" && rm -rf "${out:?}/shard$i"
    echo "shard $i: $(tail -1 "$out/sweep-shard$i.log")" | tee -a "$out/session.log"
done
