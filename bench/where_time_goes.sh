#!/usr/bin/env bash
# One device call: where the slowest generated kernels spend their time. For each spec (a
# bench/kernel_times.py spec), the kernels' times as generated, with -use_fast_math (how much the
# precise fp32 exp/log/division cost), with fp32 instead of double sum accumulators (how much the
# double conversions and adds cost), then Nsight Compute's counters (bench/ncu_table.py).
#   PYTHONPATH=. bench/where_time_goes.sh [SPEC ...]      (default: the tasks furthest from their floor)
# VARIANTS (default "plain fast float ncu") picks which of the four to run.
# Output: $OUT/where.log (everything), the ncu CSVs; the tables on stdout.
set -uo pipefail
out=${OUT:-./where-out}
mkdir -p "$out"
specs=("$@")
if [ "${#specs[@]}" -eq 0 ]; then
    specs=(softmax_dim1_fp16 'softmax_dim1_fp16:BLOCK=128,CACHE=2,COLW=4,ITEMS=8,VEC=4'
           loss_kl_div 'loss_kl_div:G0_BLOCK=256,G0_CACHE=1,G0_ITEMS=8,G0_VEC=2'
           loss_cross_entropy softmax_log_lastdim norm_groupnorm softmax_lastdim red_logsumexp_dim1
           red_argmax_dim1 'pool_max3d:BLOCK=128,OUT_W=4,ROWS=8,SMEM=0,VEC=4')
fi
variants=" ${VARIANTS:-plain fast float ncu} "
kt=(python3 bench/kernel_times.py)
{
    [[ $variants == *" plain "* ]] && { echo "## as generated"; "${kt[@]}" "${specs[@]}"; }
    [[ $variants == *" fast "* ]] && { echo; echo "## -use_fast_math"; "${kt[@]}" "${specs[@]}" --options=-use_fast_math; }
    [[ $variants == *" float "* ]] && { echo; echo "## float sum accumulators"
        "${kt[@]}" "${specs[@]}" --replace 'struct Acc { double s; };=>struct Acc { float s; };' 'a.s += (double)x;=>a.s += x;'; }
    [[ $variants == *" ncu "* ]] && { echo; echo "## ncu"; python3 bench/ncu_table.py "${specs[@]}"; }
} 2>&1 | tee "$out/where.log" | grep -E '^(## |\| |whole|GPU)'
