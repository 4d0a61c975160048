#!/usr/bin/env bash
# One device call: loop throughput with every compile cache cold (ours and the CUDA driver's, which
# NVRTC 12.9+ uses), today's code against another version's in ab_old/ (made by hand: that version's
# core/ and resources/, and today's bench/, main.py and pyproject.toml, so both use one harness),
# alternating; then the search loop's GPU tests.
#   OUT=DIR PYTHONPATH=. bash bench/ab_cold.sh       ($OUT/{new,old}-throughput-TASK.md; projects.tar.xz: logs, projects)
# ab_old/ is git-ignored: pass it to the device tool in `carry`.
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -d ab_old/core ] || { echo "ab_old/ is missing: copy the other version's core/ and resources/ and today's bench/, main.py and pyproject.toml there first" >&2; exit 2; }
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } | tee "$OUT/gpu.txt"
[ -n "${FIRST:-}" ] && eval "$FIRST"
for spec in ${SPECS:-bench/tasks/pw_trig_chain_1ms.py:random:150 loss_kl_div:ppo:250}; do
  for tree in new old; do
    root=.; [ "$tree" = old ] && root=ab_old
    (cd "$root" && PYTHONPATH=. python3 bench/throughput.py --out "$OUT/$tree" --fresh-compile-cache "$spec" | grep "^| [a-z]" | sed "s/^/$tree /")
    mv "$OUT/$tree/throughput.md" "$OUT/$tree/throughput-$(basename "${spec%%:*}" .py).md"
  done
done
rm -rf "$OUT"/*/.driver-cache "$OUT"/*/*.cuagent-wal "$OUT"/*/*.cuagent-shm
# The tables stay as files; the projects and logs go into one archive (the device tool brings back
# only so many files, and the old tree's did not come back in the nineteenth session).
for tree in new old; do
  for table in "$OUT/$tree"/throughput-*.md; do [ -f "$table" ] && cp "$table" "$OUT/$tree-$(basename "$table")"; done
done
(cd "$OUT" && tar cJf projects.tar.xz new old && rm -rf new old)
[ "${TESTS:-1}" = 1 ] && timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_search_gpu.py -p no:cacheprovider 2>&1 | tail -3
