#!/usr/bin/env bash
# Session 21, call 1: q, k, v convolved in one launch each way with q and k L2-normalised inside it (fla's
# l2norm kernels off). Carry .whl, .gpu-data/ts-val, .device-commit, .triton-cache, .base-tree
# (7c1ea88: git archive 7c1ea88 dormouse | tar x -C .base-tree/7c1ea88).
#  1. GPU tests: the conv kernels against float64 (with the norm), fla's KDA gates, the graphed step.
#  2. B 64 A/B interleaved three times: 7c1ea88 (session 20's end) against this commit; then profiled.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-conv-qknorm 200 tests/gpu/test_conv_fused.py)")
cmds+=("$(pytest_cmd gpu-kda-graphed-qknorm 200 tests/gpu/test_kda_fla.py tests/gpu/test_graphed_step.py)")
interleaved 3 \
  b64-7c1ea88 "$(base_bench 7c1ea88) --batch-size 64 --note 'batch 64, 7c1ea88 (session 20 end), round \$round of 3'" \
  b64-qkconv "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, q k v convs in one launch, q k normalised in it, round \$round of 3'"
cmds+=("$(timed profile-b64-qkconv "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, qk-norm conv, profiled'" 'ms_per_step|Error|device busy|device idle')")
exec bash benches/gpu_session.sh "${cmds[@]}"
