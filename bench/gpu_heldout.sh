#!/usr/bin/env bash
# One device call that checks a trained policy live on tasks it never saw, next to the GPU tests.
#
#   OUT=DIR DEADLINE=420 WEIGHTS=ppo.json BUDGET=30 POLICIES="ppo random" \
#   TESTS0="tests/gpu/test_search_gpu.py" SWEEP1="task task:200 ..." HELDOUT0="task ..." HELDOUT1="task ..." \
#   PYTHONPATH=. bench/gpu_heldout.sh
#
# Lane i runs on GPU i (with one GPU, lane 1 runs after lane 0 on GPU 0): first the pytest files of
# TESTSi, then bench/sweep.py of the tasks in SWEEPi (NAME or NAME:EVALS, 100 evaluations unless
# given), then for each task of HELDOUTi one live
# `cuda-agent bench` run per policy in POLICIES (same task back to back, so the policies are compared
# on the same GPU state), BUDGET evaluations each. No task pair starts after DEADLINE seconds from the
# start. $OUT gets session.log, one log per lane and laneI.tar.gz (sweep output, each run's project
# and table, and runs.tsv: task, policy, exit status, wall seconds).
set -uo pipefail
out=${OUT:-./gpu-heldout-out}
deadline=${DEADLINE:-420}
budget=${BUDGET:-30}
read -ra policies <<< "${POLICIES:-ppo random}"
mkdir -p "$out"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 1 ]; then
    echo "no GPU found (nvidia-smi -L lists none): nothing to measure" >&2
    exit 3
fi
weights_args=()
if [ -n "${WEIGHTS:-}" ]; then weights_args=(--weights "$WEIGHTS"); fi
echo "$(date -u +%FT%TZ) gpus=$gpus deadline=$deadline budget=$budget policies=${policies[*]} weights=${WEIGHTS:-shipped}" \
    | tee "$out/session.log"

lane() {   # lane index, GPU index
    local i=$1 gpu=$2 dir="$out/lane$1"
    local tests_var="TESTS$i" sweep_var="SWEEP$i" heldout_var="HELDOUT$i"
    local tests sweep heldout
    read -ra tests <<< "${!tests_var:-}"
    read -ra sweep <<< "${!sweep_var:-}"
    read -ra heldout <<< "${!heldout_var:-}"
    mkdir -p "$dir"
    export CUDA_VISIBLE_DEVICES=$gpu
    if [ "${#tests[@]}" -gt 0 ]; then
        python3 -m pytest -q -m gpu "${tests[@]}" -p no:cacheprovider -s > "$dir/gpu-tests.log" 2>&1
        echo "lane $i gpu tests: exit $? ($(tail -1 "$dir/gpu-tests.log"))"
    fi
    # SWEEPi entries are NAME or NAME:EVALS (default 100); one bench/sweep.py per evaluation count.
    local evals
    [ "${#sweep[@]}" -gt 0 ] && for evals in $(printf '%s\n' "${sweep[@]}" | awk -F: '{print ($2 == "" ? 100 : $2)}' | sort -un); do
        local names=()
        for entry in "${sweep[@]}"; do
            local n=${entry%%:*} e=${entry#*:}
            [ "$e" = "$entry" ] && e=100
            [ "$e" = "$evals" ] && names+=("$n")
        done
        python3 bench/sweep.py --evals "$evals" --tasks "${names[@]}" --deadline $((deadline - SECONDS)) \
            --out "$dir/sweep-$evals" > "$dir/sweep-$evals.log" 2>&1
        echo "lane $i sweep of ${names[*]} at $evals evaluations: exit $?"
        rm -f "$dir/sweep-$evals/sweep-projects.tar.gz"
    done
    printf 'task\tpolicy\texit\tseconds\n' > "$dir/runs.tsv"
    for task in "${heldout[@]}"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "lane $i deadline: $task and later tasks not started"
            break
        fi
        for policy in "${policies[@]}"; do
            local t0=$SECONDS
            python3 -m core.cli bench resources/tasks --tasks "$task" --policy "$policy" "${weights_args[@]}" \
                --budget "$budget" --seed 1 --projects "$dir/$policy" --out "$dir/$policy/$task.md" \
                >> "$dir/bench.log" 2>&1
            printf '%s\t%s\t%s\t%s\n' "$task" "$policy" "$?" "$((SECONDS - t0))" >> "$dir/runs.tsv"
        done
    done
}

if [ "$gpus" -ge 2 ]; then
    lane 0 0 > "$out/lane0.log" 2>&1 &
    lane 1 1 > "$out/lane1.log" 2>&1 &
    wait
else
    lane 0 0 > "$out/lane0.log" 2>&1
    lane 1 0 > "$out/lane1.log" 2>&1
fi
for i in 0 1; do
    cat "$out/lane$i.log" | tee -a "$out/session.log"
    tar -czf "$out/lane$i.tar.gz" -C "$out" "lane$i" && rm -rf "${out:?}/lane$i"
done
