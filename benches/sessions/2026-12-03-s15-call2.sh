#!/usr/bin/env bash
# Session 15, call 2: fla's fused SwiGLU kernels (model/swiglu.py, --swiglu-backend, auto = fused on CUDA).
# Predicted at B 64 (call 1's eager profile, per step): torch's silu, mul and silu_backward over
# [64, 512, 1536] are ~5.1 ms; the fused kernels move ~0.8 GB forward and ~1.2 GB backward a step (~0.6 ms at
# ~3.5 TB/s) and the packed gradient drops the [64, 512, 3072] cat of the split's backward (~0.8 ms): about
# -5 ms of 55.7 (call 1, graphed B 64), to ~50 ms (~6.5e5 tokens/s).
#  1. GPU tests: the fused SwiGLU against float64 (tests/gpu/test_swiglu_fused.py), and the graphed step and
#     decode still equal to eager with it (the fused path is inside both graphs now).
#  2. B 64 --cuda-graph, plain / fused / plain / fused in one call (each arm twice, interleaved).
#  3. B 10 --cuda-graph fused (the <= 20 ms goal's row).
#  4. B 64 --cuda-graph fused profiled: the new "device busy" line says how much of the step the GPU idles.
#  5. The recipe on nanoGPT's split with the new default (its held-out number was measured with torch's
#     SwiGLU, 1.9769): seed 0, the same command as session 14.
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
source benches/sessions/heldout-run.sh
export TRITON_CACHE_BACK=1
cmds=("timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_swiglu_fused.py tests/gpu/test_graphed_step.py tests/gpu/test_graphed_decode.py > \$OUT/gpu-tests.log 2>&1; tail -15 \$OUT/gpu-tests.log")
for arm in plain-1 fused-1 plain-2 fused-2; do
  cmds+=("$(timed b64-$arm "python3 -m dormouse bench $S --batch-size 64 --swiglu-backend ${arm%-*} --note 'batch 64, swiglu ${arm%-*} (A/B in one call, $arm)'")")
done
cmds+=("$(timed b10-fused "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, swiglu fused'")")
cmds+=("$(timed profile-b64-fused "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, swiglu fused, profiled'" 'ms_per_step|first_step|Error|device busy')")
cmds+=("$(heldout_run_cmd recipe-swiglu "--config configs/tinyshakespeare.toml")")
exec bash benches/gpu_session.sh "${cmds[@]}"
