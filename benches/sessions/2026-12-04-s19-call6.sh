#!/usr/bin/env bash
# Session 19, call 6. Carry .whl, .gpu-data/ts-val, .device-commit and .triton-cache.
# Call 5's profile still had one idle gap of 4.7 ms in three steps with the host inside aten::to/copy_
# (and others of ~1.3 ms); the trainer's phases are named ranges now, so the gaps line places them.
#  1. B 64 profiled at this commit.
#  2. B 64 A/B interleaved twice: default allocator against PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#     (a data-dependent size a step, the coalesced engram gradient's, may make the caching allocator
#     free and allocate, which synchronises).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(timed profile-b64-phases "python3 -m dormouse bench $S --profile 3 --note 'batch 64, profiled (named phases)'" 'ms_per_step|Error|device busy|device idle|longest')")
interleaved 2 \
  b64-alloc-default "python3 -m dormouse bench $S --note 'batch 64, default allocator, round \$round of 2'" \
  b64-alloc-expandable "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 -m dormouse bench $S --note 'batch 64, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, round \$round of 2'"
cmds+=("$(timed profile-b64-expandable "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 -m dormouse bench $S --profile 3 --note 'batch 64, expandable_segments, profiled (named phases)'" 'ms_per_step|Error|device busy|device idle|longest')")
exec bash benches/gpu_session.sh "${cmds[@]}"
