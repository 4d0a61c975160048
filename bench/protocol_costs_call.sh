#!/usr/bin/env bash
# One device call: the protocol's passes one by one (bench/protocol_costs.py), then the evaluator's
# and the comparison's GPU tests in one pytest process.
#   OUT=DIR PYTHONPATH=. bash bench/protocol_costs_call.sh
set -uo pipefail
out=${OUT:-./protocol-costs-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
git log --oneline -1
python3 bench/protocol_costs.py ${COST_TASKS:-bench/tasks/act_mish_1ms.py resources/tasks/fused_bias_gelu_scale_fp16.py \
    resources/tasks/fused_add_layernorm.py resources/tasks/loss_kl_div.py} --json "$out/protocol_costs.json" \
    2>&1 | tee "$out/protocol_costs.md" | grep -v Warning
if [ -n "${COST_TESTS:-tests/gpu/test_evaluator_gpu.py tests/gpu/test_compare_gpu.py}" ]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider ${COST_TESTS:-tests/gpu/test_evaluator_gpu.py tests/gpu/test_compare_gpu.py} \
        > "$out/gpu-tests.log" 2>&1
    echo "gpu tests: exit $?"; tail -5 "$out/gpu-tests.log"
fi
