#!/usr/bin/env bash
# Session 16, call 7: call 6's idle line (B 64, profiled): the device idled 11.1 ms a step under the
# profiler, and among the host events then were SparseRowAdam's index_copy_ calls, 1.7 ms a step, which
# deterministic mode runs through index_put_'s sorting path. The rows are distinct (coalesced), so they now
# run with deterministic mode off around them (the same bits). Predicted: up to ~1.5 ms a step.
#  B 64 --cuda-graph, two arms twice each, interleaved: 6e318ff (call 6's) and this commit.
# Carry .whl, .gpu-data, .device-commit, .triton-cache and .base-tree.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
cmds=()
base="cd .base-tree/6e318ff && DORMOUSE_COMMIT=6e318ff python3 -m dormouse bench ${S/$V/../../$V} --history ../../benches/history.tsv --log-dir ../../benches/logs"
for i in 1 2; do
  cmds+=("$(timed b64-c6-$i "($base --note 'batch 64, 6e318ff, arm $i of 2 arms x 2')")")
  cmds+=("$(timed b64-rows-$i "python3 -m dormouse bench $S --note 'batch 64, SparseRowAdam row writes outside deterministic mode, arm $i of 2 arms x 2'")")
done
exec bash benches/gpu_session.sh "${cmds[@]}"
