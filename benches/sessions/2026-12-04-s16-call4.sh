#!/usr/bin/env bash
# Session 16, call 4: after the own conv kernels and the fused gated norm (call 3: B 64 46.72 / 46.21 ms
# against 50.94 / 51.88 for session 15's end in the same call, -8.5 %).
#  1. B 64 --cuda-graph profiled: where the 46 ms go now (the device-busy line, the kernels by name).
#  2. The recipe (configs/tinyshakespeare.toml, nanoGPT's split, held-out tail) with the new defaults: both
#     changes move the bf16 numerics (session 15: 1.9794 with the fused SwiGLU and bf16 pre-norms).
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
source benches/sessions/heldout-run.sh
export TRITON_CACHE_BACK=1
cmds=("$(timed profile-b64-conv "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, own conv kernels and gated norm, profiled'" 'ms_per_step|first_step|Error|device busy')")
cmds+=("$(heldout_run_cmd recipe-conv "--config configs/tinyshakespeare.toml")")
exec bash benches/gpu_session.sh "${cmds[@]}"
