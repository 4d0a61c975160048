#!/usr/bin/env bash
# One device call (2026-12-06): the protocol's passes one by one (bench/protocol_costs.py), the
# evaluator's GPU tests, then the generator cases added
# this session (tests/gpu/test_codegen_cases_gpu.py -k "new_ or gather or unfold or diagonals"), one process after the other.
#   OUT=DIR PYTHONPATH=. bash bench/protocol_costs_call.sh
# COST_TASKS, COST_TESTS and CASES_K override the three parts ("" skips the tests).
set -uo pipefail
out=${OUT:-./protocol-costs-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
git log --oneline -1 2>/dev/null
python3 bench/protocol_costs.py ${COST_TASKS:-bench/tasks/act_mish_1ms.py resources/tasks/fused_add_layernorm.py} \
    --json "$out/protocol_costs.json" \
    2>&1 | grep -v Warning | tee "$out/protocol_costs.md"
tests=${COST_TESTS-tests/gpu/test_evaluator_gpu.py}
if [ -n "$tests" ]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider $tests > "$out/gpu-tests.log" 2>&1
    echo "gpu tests ($tests): exit $?"; tail -3 "$out/gpu-tests.log"
fi
k=${CASES_K-new_ or gather or unfold or diagonals}
if [ -n "$k" ]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_codegen_cases_gpu.py -k "$k" > "$out/gpu-cases.log" 2>&1
    echo "new generator cases (-k '$k'): exit $?"; tail -3 "$out/gpu-cases.log"
fi
