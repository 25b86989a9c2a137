#!/usr/bin/env bash
# Session 16, call 6: the host's share of the B 64 step (call 5: 44-45 ms with the engram, 38.6 without;
# the GPU's kernels 40.5 ms). SparseRowAdam no longer drops the coalesced rows whose gradient is exactly
# zero by a boolean index (a host sync: the host waited for the GPU, then launched the rest with the GPU
# idle); it writes them back unchanged instead, the same bits (tests/test_sparse.py). And `bench
# --profile` gains an idle line: the device's idle gaps and the host events that overlap them.
# Predicted: up to ~1 ms a step from the removed sync; the idle line says where the rest goes.
#  1. GPU test: the graphed step still equals the eager one bit for bit (tests/gpu/test_graphed_step.py).
#  2. B 64 --cuda-graph, two arms twice each, interleaved: 4f81850 (call 5's code) and this commit.
#  3. B 64 profiled at this commit: the busy and idle lines.
# Carry .whl, .gpu-data, .device-commit, .triton-cache and .base-tree.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_graphed_step.py > \$OUT/gpu-graphed.log 2>&1; tail -3 \$OUT/gpu-graphed.log")
base="cd .base-tree/4f81850 && DORMOUSE_COMMIT=4f81850 python3 -m dormouse bench ${S/$V/../../$V} --history ../../benches/history.tsv --log-dir ../../benches/logs"
for i in 1 2; do
  cmds+=("$(timed b64-base-$i "($base --note 'batch 64, 4f81850 (SparseRowAdam drops zero rows), arm $i of 2 arms x 2')")")
  cmds+=("$(timed b64-nosync-$i "python3 -m dormouse bench $S --note 'batch 64, SparseRowAdam without the boolean-index sync, arm $i of 2 arms x 2'")")
done
cmds+=("$(timed profile-b64-idle "python3 -m dormouse bench $S --profile 3 --note 'batch 64, profiled with the idle line'" 'ms_per_step|first_step|Error|device busy|device idle')")
exec bash benches/gpu_session.sh "${cmds[@]}"
