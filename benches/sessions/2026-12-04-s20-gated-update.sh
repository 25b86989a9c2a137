#!/usr/bin/env bash
# Session 20, call 2: the graphed update queued before the check, skipped on the device when a loss term
# is not finite (660928f). Carry .whl, .gpu-data/ts-val, .device-commit, .triton-cache, .base-tree
# (2b40b0b: mkdir -p .base-tree/2b40b0b && git archive 2b40b0b dormouse | tar x -C .base-tree/2b40b0b).
#  1. The graphed step's GPU tests, with the new NaN-loss test.
#  2. B 64 A/B interleaved three times: 2b40b0b (check, then update) against this commit; then profiled.
#  3. B 64 without --cuda-graph, profiled: the op table by input shapes names which ops launch the
#     ~77 small reduce kernels a step (a graph's replayed kernels carry no op).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-graphed-step 200 tests/gpu/test_graphed_step.py)")
interleaved 3 \
  b64-2b40b0b "$(base_bench 2b40b0b) --batch-size 64 --note 'batch 64, 2b40b0b (check, then update), round \$round of 3'" \
  b64-gated "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, update queued before the check (skipped on the device), round \$round of 3'"
cmds+=("$(timed profile-b64-gated "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, gated update, profiled'")")
cmds+=("$(timed profile-b64-eager "python3 -m dormouse bench ${S/--cuda-graph /} --batch-size 64 --profile 2 --note 'batch 64, no CUDA graph, profiled (op attribution)'")")
exec bash benches/gpu_session.sh "${cmds[@]}"
