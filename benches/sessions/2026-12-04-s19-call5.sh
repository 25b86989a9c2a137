#!/usr/bin/env bash
# Session 19, call 5. Carry .whl, .gpu-data/ts-val, .device-commit, .triton-cache and .base-tree
# (786ec75, call 3's "new" arm: mkdir -p .base-tree/786ec75 && git archive 786ec75 dormouse | tar x -C ...).
#  1. GPU tests: the short conv's kernels, now four positions an iteration (and with a dilation); the
#     graphed step (graphed == eager, bit for bit) with the look-up's unchecked bytes and the pinned batch.
#  2. B 64 A/B interleaved twice: 786ec75 against this commit (the look-up's host sync removed, the batch
#     from pinned memory, the unrolled conv kernels).
#  3. This commit profiled at B 64 (busy, idle and the longest gaps); B 10.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
base="cd .base-tree/786ec75 && DORMOUSE_COMMIT=786ec75 python3 -m dormouse bench ${S/$V/../../$V} --batch-size 64 --history ../../benches/history.tsv --log-dir ../../benches/logs"
cmds=("$(pytest_cmd gpu-conv 200 tests/gpu/test_conv_fused.py)")
cmds+=("$(pytest_cmd gpu-graphed-step-2 150 tests/gpu/test_graphed_step.py)")
interleaved 2 \
  b64-786ec75 "$base --note 'batch 64, 786ec75 (call 3 new arm), round \$round of 2'" \
  b64-head "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, look-up without host sync, pinned batch, unrolled conv, round \$round of 2'"
cmds+=("$(timed profile-b64-head "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, look-up without host sync, pinned batch, unrolled conv, profiled'" 'ms_per_step|Error|device busy|device idle|longest')")
cmds+=("$(timed b10-head "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, look-up without host sync, pinned batch, unrolled conv'")")
exec bash benches/gpu_session.sh "${cmds[@]}"
