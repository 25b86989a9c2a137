#!/usr/bin/env bash
# Device call written in session 21 (not run: no device was lent for its call 5) for the speed issue's open
# goal, batch 64 at >= 1e6 tokens/s (session 21: 9.54e5, 34.34 ms; docs/performance.md, Next). Carry .whl,
# .gpu-data/ts-val, .device-commit, .triton-cache and .base-tree (7c1ea88: mkdir -p .base-tree/7c1ea88 &&
# git archive 7c1ea88 dormouse | tar x -C .base-tree/7c1ea88); the tree with all of them must stay under
# the device's 64 MiB (session 21's call 4 was refused with 37 MB of Triton cache: drop the cache then).
#  1. The cold start with session 21's one-launch q/k/v conv (its kernels compile at the first step):
#     B 10 from an empty Triton cache (goal: first step within 60 s; 29.1 s in session 20), then B 10 warm.
#  2. The GPU tests of the conv and the graphed step at this commit.
#  3. B 64 interleaved three times on another machine: 7c1ea88 (session 20's end), this commit, and
#     d542564 (branch s21-rest-views, not merged: the projection's rest returned as views, its gradient
#     written once; ~0.1 ms predicted from 24 copies of ~10 us a step; its GPU tests not run yet).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(timed cold-b10 "TRITON_CACHE_DIR=\$(mktemp -d) python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, empty Triton cache (cold start)'")")
cmds+=("$(timed warm-b10 "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10'")")
cmds+=("$(pytest_cmd gpu-conv-graphed 300 tests/gpu/test_conv_fused.py tests/gpu/test_graphed_step.py)")
interleaved 3 \
  b64-7c1ea88 "$(base_bench 7c1ea88) --batch-size 64 --note 'batch 64, 7c1ea88 (session 20 end), round \$round of 3'" \
  b64-head "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, round \$round of 3'" \
  b64-d542564 "$(base_bench d542564) --batch-size 64 --note 'batch 64, d542564 (rest as views), round \$round of 3'"
exec bash benches/gpu_session.sh "${cmds[@]}"
