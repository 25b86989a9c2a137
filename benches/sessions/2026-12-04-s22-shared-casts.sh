#!/usr/bin/env bash
# Session 22, call 2: the looped block's bf16 weight casts shared by a layer's applications, their weight
# gradients summed in the matmul (projections.shared_casts; 24 casts and 44 fp32 adds fewer a `small`
# step predicted by benches/op_inventory.py). Carry .base-tree with d542564 (the projection's rest as
# views: merged into this commit, without the shared casts).
#  1. GPU tests: the bf16 projections (the shared path against the unshared one, addmm with fp32 output
#     on torch 2.11), the graphed step (its eager parity now through the shared casts), the conv kernels
#     (the rest as views, merged).
#  2. B 64 interleaved three times: d542564, this commit.
#  3. A profile of this commit at B 64, with the device time by phase (the update's kernels apart).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-shared-casts 300 tests/gpu/test_projections_cuda.py tests/gpu/test_graphed_step.py tests/gpu/test_conv_fused.py)")
interleaved 3 \
  b64-d542564 "$(base_bench d542564) --batch-size 64 --note 'batch 64, d542564 (rest as views), session 22 call 2 round \$round of 3'" \
  b64-shared "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, shared weight casts, round \$round of 3'"
cmds+=("$(timed profile-b64-shared "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, shared weight casts, profiled'" 'ms_per_step|Error|device busy|device idle|device time by phase|^  dormouse')")
exec bash benches/gpu_session.sh "${cmds[@]}"
