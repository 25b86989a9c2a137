#!/usr/bin/env bash
# Session 15, call 1 for the speed issue's one open goal: batch 64 at >= 1e6 tokens/s
# (session 14: 6.0e5, 54.4 ms/step, 50.4 ms of it GPU work; docs/performance.md). Carry .whl, .gpu-data,
# .device-commit and .triton-cache. (Run in session 14, 2026-12-03-s14-call{1,2,3}.sh: the B 64 profile
# under the CUDA graph, B 64 without the engram, torch.compile at B 64, fp32 and tf32 at B 10, the
# baselines in one process.)
#  1. `small` B 64 profiled with the eager step: the profile's second table groups ops by input shapes,
#     which names the ops behind the ~30 generic `elementwise_kernel<128,4>` launches per step (replayed
#     graph kernels have no op to group under, so this one runs without --cuda-graph).
#  2. The same shape under --cuda-graph, for the ms/step in the same call.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --batch-size 64 --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "$(timed profile-eager-b64 "python3 -m dormouse bench $S --profile 2 --note 'batch 64, eager step, profiled with shapes'")" \
  "$(timed graph-b64 "python3 -m dormouse bench $S --cuda-graph --note 'batch 64, same call as the eager profile'")"
