#!/usr/bin/env bash
# Session 14, call 2 (items 3-4 of next-h200-speed.sh): `small` B 10 in fp32 (IEEE Triton dots) and in
# tf32, each in its own process (Triton's fp32 precision is fixed per process; goal 30 ms, not measured
# since session 4), then `small` B 64 under torch.compile: inside the CUDA graph, then with the eager
# step (the B 64 profile of call 1 puts ~14 ms of its 50 ms of GPU time per step in elementwise and cat
# kernels, which Inductor fuses). Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "$(timed fp32 "python3 -m dormouse bench $S --dtype fp32 --batch-size 10 --note 'fp32 (IEEE Triton dots)'")" \
  "$(timed tf32 "python3 -m dormouse bench $S --dtype tf32 --batch-size 10 --note 'tf32'")" \
  "$(timed compile-graph-b64 "timeout 200 python3 -m dormouse bench $S --dtype bf16 --batch-size 64 --compile --note 'batch 64, torch.compile under --cuda-graph'")" \
  "$(timed compile-b64 "timeout 200 python3 -m dormouse bench --preset small --seq-len 512 --dtype bf16 --data $V --batch-size 64 --compile --note 'batch 64, torch.compile, eager step'")"
