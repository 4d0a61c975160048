#!/usr/bin/env bash
# Twelfth session, call 1 (issue 3): GPU tests of the split tasks and the softmax, 200-evaluation
# sweeps (known points, their one-knob neighbours, then random) of red_mean_dim0 and
# softmax_log_lastdim, and the other split tasks' default (OCC=0), known best and one random schedule.
#   PYTHONPATH=. bash bench/twelfth_call1.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
known=docs/results/known-2026-12-04-twelfth.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
git log -1 --format=%h 2>/dev/null
python3 bench/sweep.py --evals 200 --neighbours --tasks red_mean_dim0 softmax_log_lastdim --known $known \
    --timed-ms 25 --deadline 260 --out "$OUT/sweep200" 2>&1 | grep -v '^ ' | tail -12
python3 bench/sweep.py --evals 3 --tasks loss_mse loss_smooth_l1 norm_batchnorm2d_train red_argmax_dim1 \
    --known $known --timed-ms 25 --deadline 120 --out "$OUT/split3" 2>&1 | grep -E '^\|' 
timeout 170 python3 -m pytest -q -m gpu tests/gpu/test_codegen_gpu.py -p no:cacheprovider \
    -k "red_mean_dim0 or red_argmax_dim1 or loss_mse or loss_smooth_l1 or norm_batchnorm2d_train or softmax_log_lastdim" 2>&1 | tail -3
