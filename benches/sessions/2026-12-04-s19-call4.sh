#!/usr/bin/env bash
# Session 19, call 4. Carry .whl, .gpu-data/ts-val, .device-commit and .triton-cache.
#  1. benches/conv_unroll_probe.py (at a4c1dc9; its kernels became the model's, its sweep conv_probe.py's):
#     the short conv's kernels unrolled by four positions against the model's
#     (33 / 59 us a call at B 64 in call 3's profile: ~2.0 / 1.7 TB/s).
#  2. B 64 profiled, with bench's new line of the longest idle gaps (wall 37.5 ms against 34.3 busy in call 3).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(timed conv-unroll-probe "python3 benches/conv_unroll_probe.py" 'model|unrolled|Error')")
cmds+=("$(timed profile-b64 "python3 -m dormouse bench $S --profile 3 --note 'batch 64, profiled (idle gaps line)'" 'ms_per_step|Error|device busy|device idle|longest')")
exec bash benches/gpu_session.sh "${cmds[@]}"
