#!/usr/bin/env bash
# Session 20, call 5: the next step's inputs and row look-up staged behind the update, before the check's
# wait (GraphedStep.stage). Carry .whl, .gpu-data/ts-val, .device-commit, .triton-cache, .base-tree
# (8165164: git archive 8165164 dormouse | tar x -C .base-tree/8165164).
#  1. The graphed step's GPU tests (eager parity with staged inputs; one sync a step; the staged batch).
#  2. B 64 A/B interleaved three times: 8165164 (RowPlan, no staging) against this commit; then profiled.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-graphed-step-stage 240 tests/gpu/test_graphed_step.py)")
interleaved 3 \
  b64-8165164 "$(base_bench 8165164) --batch-size 64 --note 'batch 64, 8165164 (RowPlan, no staging), round \$round of 3'" \
  b64-stage "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, next inputs staged before the check, round \$round of 3'"
cmds+=("$(timed profile-b64-stage "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, next inputs staged, profiled'" 'ms_per_step|Error|device busy|device idle')")
exec bash benches/gpu_session.sh "${cmds[@]}"
