#!/usr/bin/env bash
# Where an evaluation's time goes: one `cuda-agent run` under cProfile, with the evaluator's runner
# and judge processes profiled too (CUDA_AGENT_PROFILE), and the top of each profile printed.
#
#   OUT=DIR bench/profile_run.sh TASK_FILE POLICY BUDGET [NAME]
#
# Writes DIR/NAME/{run.log,project.cuagent,*.prof,*.txt}; each .txt is the profile sorted by
# cumulative time (GPU work shows inside the calls that synchronize).
set -uo pipefail
task=$1 policy=$2 budget=$3 name=${4:-$(basename "$task" .py)}
dir=${OUT:-./profile-out}/$name
mkdir -p "$dir"
CUDA_AGENT_PROFILE="$dir" python3 -m cProfile -o "$dir/main.prof" -m core.cli run "$task" --policy "$policy" \
    --budget "$budget" --project "$dir/project.cuagent" > "$dir/run.log" 2>&1
echo "$name: exit $? ($(grep -m1 'finished' "$dir/run.log"))"
for prof in "$dir"/*.prof; do
    python3 - "$prof" > "${prof%.prof}.txt" <<'PY'
import pstats, sys
stats = pstats.Stats(sys.argv[1])
stats.sort_stats("cumulative").print_stats(45)
stats.sort_stats("tottime").print_stats(25)
PY
done
