#!/usr/bin/env bash
# Session 18, call 2. NesterovSinkhorn's SR-Sinkhorn now runs dormouse's Triton kernels on CUDA
# (train/sinkhorn_kernels.py; call 1's probe: 1249 -> 407 us a `small` step in graph replays, so ~-0.8 ms
# a step predicted at any batch).
#  1. GPU tests: the kernels against fp64 torch; the graphed step (graphed == eager bit for bit, the
#     update graph now holding the kernels).
#  2. B 64 --cuda-graph: the session's start (88a8e23) and this commit, twice each, interleaved; then
#     this commit profiled; then the norm and graphed-decode GPU tests (unchanged code, last run at a187b2b).
# Carry .whl, .gpu-data, .device-commit, .triton-cache and .base-tree (mkdir -p .base-tree/88a8e23 &&
# git archive 88a8e23 dormouse | tar x -C .base-tree/88a8e23).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=(
  "$(pytest_cmd gpu-sinkhorn 90 tests/gpu/test_sinkhorn_kernels.py)"
)
base="cd .base-tree/88a8e23 && DORMOUSE_COMMIT=88a8e23 python3 -m dormouse bench ${S/$V/../../$V} --history ../../benches/history.tsv --log-dir ../../benches/logs"
for i in 1 2; do
  cmds+=("$(timed b64-base-$i "($base --note 'batch 64, 88a8e23, arm $i of 2 arms x 2')")")
  cmds+=("$(timed b64-sinkhorn-$i "python3 -m dormouse bench $S --note 'batch 64, SR-Sinkhorn by Triton kernels, arm $i of 2 arms x 2'")")
done
cmds+=("$(pytest_cmd gpu-graphed-step 180 tests/gpu/test_graphed_step.py)")
cmds+=("$(timed profile-b64-sinkhorn "python3 -m dormouse bench $S --profile 3 --note 'batch 64, SR-Sinkhorn by Triton kernels, profiled'" 'ms_per_step|first_step|Error|device busy|device idle')")
cmds+=("$(pytest_cmd gpu-norm-decode 120 tests/gpu/test_norm_fused.py tests/gpu/test_graphed_decode.py)")
exec bash benches/gpu_session.sh "${cmds[@]}"
