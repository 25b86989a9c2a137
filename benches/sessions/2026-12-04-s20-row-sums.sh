#!/usr/bin/env bash
# Session 20, call 4: the tables' gradients coalesced by a RowPlan made with the prefetched hash (no host
# sync before the update; 8165164, sums by dormouse's Triton kernel), with the update queued before the check. Carry .whl, .gpu-data/ts-val,
# .device-commit, .triton-cache, .base-tree (2b40b0b: git archive 2b40b0b dormouse | tar x -C .base-tree/2b40b0b).
#  1. GPU tests: RowPlan against torch's coalesce (bits, no sync); the graphed step's (eager parity, the
#     NaN step skipped on the device, one host sync a step).
#  2. B 64 A/B interleaved three times: 2b40b0b against this commit; then profiled.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-row-plan-kernel 120 tests/gpu/test_row_plan.py)")
cmds+=("$(pytest_cmd gpu-graphed-step-rowsums 240 tests/gpu/test_graphed_step.py)")
interleaved 3 \
  b64-base-call4 "$(base_bench 2b40b0b) --batch-size 64 --note 'batch 64, 2b40b0b (coalesce waits, check, then update), round \$round of 3'" \
  b64-rowsums "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, RowPlan coalesce (Triton row sums), update before the check, round \$round of 3'"
cmds+=("$(timed profile-b64-rowsums "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, RowPlan coalesce (Triton row sums), profiled'" 'ms_per_step|Error|device busy|device idle')")
exec bash benches/gpu_session.sh "${cmds[@]}"
