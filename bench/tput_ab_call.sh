#!/usr/bin/env bash
# One device call: GPU tests of the evaluator's cost changes, then loop throughput on act_mish_1ms
# (1 ms, 3.5 GiB moved, random search, N candidates, cold compile caches) with this tree ("after")
# and with the files under bench/ab/before/ laid over a copy of it ("before"), alternated ROUNDS times
# on the same GPU. Each tree has its own cache (ceilings, baselines, compiles). bench/ab/ is not
# committed: fill it before the call, e.g. for the thirty-third session's A/B
#   mkdir -p bench/ab/before/core/evaluation
#   git show 4fdf4c6:core/evaluation/roofline.py > bench/ab/before/core/evaluation/roofline.py
#   git show 4fdf4c6:core/evaluation/timer.py > bench/ab/before/core/evaluation/timer.py
# then
#   OUT=DIR [ROUNDS=2] [N=60] [TESTS="tests/gpu/..."] PYTHONPATH=. bash bench/tput_ab_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; echo "cpus $(nproc)"; } | tee "$OUT/gpu.txt"
# shellcheck disable=SC2086
python3 -m pytest -q -s -m gpu ${TESTS:-tests/gpu/test_roofline_gpu.py} -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu-tests.log"))"; grep "copy ceiling" "$OUT/gpu-tests.log"
HERE=$PWD
[ -d bench/ab/before ] || { echo "bench/ab/before/ is missing: nothing to compare with"; exit 2; }
rm -rf /tmp/before && mkdir -p /tmp/before && cp -r core bench resources main.py /tmp/before/
cp -r bench/ab/before/. /tmp/before/
for round in $(seq 1 "${ROUNDS:-2}"); do
    for tree in after before; do
        dir=$HERE; [ "$tree" = before ] && dir=/tmp/before
        (cd "$dir" && CUDA_AGENT_CACHE="$OUT/cache-$tree" PYTHONPATH=. timeout 200 python3 bench/throughput.py \
            --fresh-compile-cache --out "$OUT/$tree-r$round" "bench/tasks/act_mish_1ms.py:random:${N:-60}" \
            > "$OUT/$tree-r$round.log" 2>&1)
        echo "$tree round $round: exit $?"; grep -A3 "^| task" "$OUT/$tree-r$round/throughput.md" | tail -1
    done
done
rm -f "$OUT"/*/*.cuagent-wal "$OUT"/*/*.cuagent-shm
python3 bench/eval_breakdown.py "$OUT"/after-r*/*.cuagent "$OUT"/before-r*/*.cuagent > "$OUT/breakdown.md" 2>&1
grep -A3 "^| candidates" "$OUT/breakdown.md" | grep "^| all"
for t in after before; do echo "$t ceilings:"; cat "$OUT"/cache-$t/ceilings/*.json | grep -E "copy|samples"; done
python3 - "$OUT" <<'PY'
import json, sqlite3, sys, glob
for p in sorted(glob.glob(sys.argv[1] + "/*-r*/*.cuagent")):
    con = sqlite3.connect(p)
    ms = [json.loads(m) for (m,) in con.execute("select measurement from candidates where measurement is not null")]
    floor = next((m.get("floor_ms") for m in ms if m.get("floor_ms")), 0)
    times = sorted(m["timing"]["median_ms"] for m in ms if m.get("timing"))
    print(p.split("/")[-2], "floor", round(floor, 4), "under", sum(bool(m.get("below_floor")) for m in ms),
          "of", len(ms), "fastest", [round(t, 4) for t in times[:3]])
PY
cd "$OUT" && tar czf projects.tar.gz */*.cuagent && rm -rf cache-*/compile* 2>/dev/null; true
