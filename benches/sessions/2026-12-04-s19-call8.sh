#!/usr/bin/env bash
# Session 19, call 8. Carry .whl, .gpu-data/ts-val, .device-commit, .triton-cache and .base-tree
# (645f7e4, call 7's code: mkdir -p .base-tree/645f7e4 && git archive 645f7e4 dormouse | tar x -C ...).
#  1. The graphed step's GPU test (graphed == eager bit for bit) with the batch and its engram rows
#     prefetched and the coalesce before the check.
#  2. B 64 A/B interleaved three times: 645f7e4 against this commit.
#  3. This commit profiled at B 64; B 10.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
base="cd .base-tree/645f7e4 && DORMOUSE_COMMIT=645f7e4 python3 -m dormouse bench ${S/$V/../../$V} --batch-size 64 --history ../../benches/history.tsv --log-dir ../../benches/logs"
cmds=("$(pytest_cmd gpu-graphed-step-3 150 tests/gpu/test_graphed_step.py)")
interleaved 3 \
  b64-645f7e4 "$base --note 'batch 64, 645f7e4 (call 7 code), round \$round of 3'" \
  b64-prefetch "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, batch and engram rows prefetched, coalesce before the check, round \$round of 3'"
cmds+=("$(timed profile-b64-prefetch "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, batch and engram rows prefetched, coalesce before the check, profiled'" 'ms_per_step|Error|device busy|device idle|longest')")
cmds+=("$(timed b10-prefetch "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, batch and engram rows prefetched, coalesce before the check'")")
exec bash benches/gpu_session.sh "${cmds[@]}"
