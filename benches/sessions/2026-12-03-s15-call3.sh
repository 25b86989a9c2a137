#!/usr/bin/env bash
# Session 15, call 3: call 2's GPU tests again, verbose and with room (call 2 gave them 240 s: six passed,
# then the limit; -q showed no names). The fused SwiGLU against float64, the bf16 pre-norm outputs bitwise,
# the graphed step and decode against eager, each test's result and duration named.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "timeout 500 python3 -m pytest -v --durations=0 -p no:cacheprovider tests/gpu/test_swiglu_fused.py tests/gpu/test_norm_fused.py tests/gpu/test_graphed_step.py tests/gpu/test_graphed_decode.py > \$OUT/gpu-tests-v.log 2>&1; grep -a -E 'PASS|FAIL|ERROR|passed|failed|^E ' \$OUT/gpu-tests-v.log | cut -c1-160 | tail -40"
