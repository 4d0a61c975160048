#!/usr/bin/env bash
# One device call after the nineteenth session (best on an 80 GB H100, where the judge ran out of
# memory): does the judge's one-pass comparison run here, does act_mish_1ms (3.5 GiB moved per call)
# now evaluate without crashes, and the GPU tests that cover the judge's and the runner's memory
# changes (a 4 TiB ModelNew, a lean runner) and the pointwise ops added in the twentieth session.
#   OUT=DIR PYTHONPATH=. bash bench/judge_memory_call.sh      (about 6 minutes)
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } | tee "$OUT/gpu.txt"
timeout 60 python3 bench/fast_match_check.py --elements 100000000 2>&1 | tee "$OUT/fast_match.log"
timeout 150 python3 bench/throughput.py --out "$OUT/mish" --fresh-compile-cache bench/tasks/act_mish_1ms.py:random:60 \
    | grep "^| [a-z]"
rm -rf "$OUT"/mish/.driver-cache "$OUT"/mish/*.cuagent-wal "$OUT"/mish/*.cuagent-shm
python3 - "$OUT"/mish/*.cuagent <<'PY'
import sqlite3, sys
for path in sys.argv[1:]:
    rows = sqlite3.connect(path).execute(
        "select status, substr(reason, 1, 120), count(*) from candidates group by status, substr(reason, 1, 40)").fetchall()
    print(path, *rows, sep="\n  ")
PY
timeout 300 python3 -m pytest -q -m gpu tests/gpu/test_compare_gpu.py tests/gpu/test_evaluator_gpu.py \
    "tests/gpu/test_codegen_cases_gpu.py::test_synthetic_case_is_correct_on_the_gpu[pow_bitwise_special]" \
    -p no:cacheprovider -p no:logging -rf > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $? ($(tail -1 "$OUT/gpu-tests.log"))"
