#!/usr/bin/env bash
# Session 16, call 1: measure before changing the short conv.
#  1. benches/conv_probe.py at B 64: fla's causal_conv1d as the model calls it (session 15's profile: 47 us
#     forward, 114 us backward kernel plus a second forward, per [64, 512, 512] call; 5 ms of the 48 ms
#     step) and each of its 16 configurations, against dormouse's own kernels (model/short_conv_kernels.py:
#     the backward recomputes the pre-activation in its tiles) over a sweep of block sizes. Predicted: the
#     bytes floor is 16 us forward and 24 us backward at 4.2 TB/s; the own kernels at 2x the floor would
#     take the 24 calls a step from ~5 ms to ~2 ms.
#  2. The GPU norm tests: the flagged pre-norm bounded by a rounding (session 15 call 3 failed its bitwise
#     form), GatedRMSNorm through fla's rms_norm_gated against float64.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "timeout 300 python3 benches/conv_probe.py > \$OUT/conv-probe.log 2>&1; cat \$OUT/conv-probe.log | tail -80" \
  "timeout 200 python3 -m pytest -v -s -p no:cacheprovider tests/gpu/test_norm_fused.py > \$OUT/gpu-norm-tests.log 2>&1; grep -a -E 'PASS|FAIL|ERROR|passed|failed|^E |max.d' \$OUT/gpu-norm-tests.log | cut -c1-220 | tail -40"
